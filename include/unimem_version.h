/* unimem version. Same major version means same ABI; the shared library's
 * SONAME is libunimem.so.<major>. */
#ifndef UNIMEM_VERSION_H
#define UNIMEM_VERSION_H

#define UM_VERSION_MAJOR 0 /* changes when the ABI does */
#define UM_VERSION_MINOR 1 /* additions */
#define UM_VERSION_PATCH 0 /* fixes */

/* The version as one number, (major << 16) | (minor << 8) | patch. */
#define UM_VERSION_HEX \
  ((UM_VERSION_MAJOR << 16) | (UM_VERSION_MINOR << 8) | (UM_VERSION_PATCH))

#define UM_STRINGIFY_(x) #x
/* The text of x after macro expansion. */
#define UM_STRINGIFY(x) UM_STRINGIFY_(x)
/* The version as "major.minor.patch". */
#define UM_VERSION_STRING                                                      \
  UM_STRINGIFY(UM_VERSION_MAJOR) "." UM_STRINGIFY(UM_VERSION_MINOR) "."        \
  UM_STRINGIFY(UM_VERSION_PATCH)

#endif /* UNIMEM_VERSION_H */
