// Must not compile: kernels/ may not see engine/ (tests/CMakeLists.txt expects this build to fail).
#include "engine/model/checkpoint.h"
