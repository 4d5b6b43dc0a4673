// Must not compile: engine/ may not see server/ (tests/CMakeLists.txt expects this build to fail).
#include "server/cli.h"
