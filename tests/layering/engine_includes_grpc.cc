// Must be rejected by the include scan: below server/, no gRPC.
#include <grpcpp/grpcpp.h>
