#ifndef CLIBZMQ_SHIM_H
#define CLIBZMQ_SHIM_H
#include <zmq.h>
#endif
