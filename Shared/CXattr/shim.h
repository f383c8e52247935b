#ifndef CXATTR_SHIM_H
#define CXATTR_SHIM_H
/* Extended attributes (glibc's, part of libc): Swift's Glibc module leaves this header out. The
 * folder blob store keeps a blob's metadata in one. */
#include <sys/xattr.h>
#endif
