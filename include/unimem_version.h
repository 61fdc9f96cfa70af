/* unimem version. Same major version means same ABI; the shared library's
 * SONAME is libunimem.so.<major>. */
#ifndef UNIMEM_VERSION_H
#define UNIMEM_VERSION_H

#define UM_VERSION_MAJOR 0
#define UM_VERSION_MINOR 1
#define UM_VERSION_PATCH 0

#define UM_VERSION_HEX \
  ((UM_VERSION_MAJOR << 16) | (UM_VERSION_MINOR << 8) | (UM_VERSION_PATCH))

#define UM_STRINGIFY_(x) #x
#define UM_STRINGIFY(x) UM_STRINGIFY_(x)
#define UM_VERSION_STRING                                                      \
  UM_STRINGIFY(UM_VERSION_MAJOR) "." UM_STRINGIFY(UM_VERSION_MINOR) "."        \
  UM_STRINGIFY(UM_VERSION_PATCH)

#endif /* UNIMEM_VERSION_H */
