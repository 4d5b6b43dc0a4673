// Must compile: engine/ may use kernels/.
#include "engine/model/checkpoint.h"
#include "kernels/dtype.h"
