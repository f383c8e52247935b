#ifndef CVIPS_SHIM_H
#define CVIPS_SHIM_H
#include <vips/vips.h>
#endif
