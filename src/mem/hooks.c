/* The calls up that the layers above register (mem.h, "Calls up"). */
#include "mem.h"

um__upcalls um__upcall;
