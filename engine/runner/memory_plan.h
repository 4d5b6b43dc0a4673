// The memory plan a runner makes before it allocates anything: weights, workspaces and KV cache
// added up and compared with the memory there is (RAM for the CPU runner, GPU memory for the CUDA
// runner), so that a model that cannot fit is refused at load with the numbers, instead of ending
// in std::bad_alloc or the kernel's OOM killer after the process has grown to the machine's size.
//
// The plan is a floor, not a promise: it counts what the runner allocates itself; the process's
// other memory (libraries, the checkpoint's mappings, the server) comes on top.

#ifndef LMSERVE_ENGINE_RUNNER_MEMORY_PLAN_H_
#define LMSERVE_ENGINE_RUNNER_MEMORY_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/weight_plan.h"

namespace lmserve::engine {

struct MemoryPlan {
  std::string device;            // "RAM", "GPU memory"
  int64_t weight_bytes = 0;      // weights as the runner holds them
  int64_t workspace_bytes = 0;   // activations, logits, kernel workspaces at the largest step
  int64_t kv_cache_bytes = 0;    // the KV pool (or the least the runner needs: one block)
  int64_t state_bytes = 0;       // recurrent-state slots of state-space layers (0: none)
  int64_t available_bytes = 0;   // what the process may still take; < 0: unknown (no check)
  std::string available_source;  // how available_bytes was found, for the message

  int64_t needed_bytes() const {
    return weight_bytes + workspace_bytes + kv_cache_bytes + state_bytes;
  }
};

// OK when the plan fits (or the available memory is unknown). ResourceExhausted otherwise, with
// every part in MiB, the sum, what is available and where that figure comes from, and `advice`
// (the flags that shrink the plan).
absl::Status CheckMemoryPlan(const MemoryPlan& plan, std::string_view advice);

// Memory this process may still take on the host: MemAvailable from /proc/meminfo, lowered to
// the cgroup's limit minus its usage where the process runs in a limited cgroup (v2:
// memory.max - memory.current; v1: memory.limit_in_bytes - memory.usage_in_bytes). `root`
// prefixes every path (tests pass a directory holding proc/ and sys/ files; "" is the real
// system). available_bytes is -1 when nothing could be read (not Linux).
struct HostMemory {
  int64_t available_bytes = -1;
  std::string source;  // "MemAvailable in /proc/meminfo", "the cgroup's memory.max ..."
};
HostMemory AvailableHostMemory(const std::string& root = "");

// Bytes of the plan's tensors at `element_bytes` each (tied tensors counted once).
int64_t WeightPlanBytes(const WeightPlan& plan, int64_t element_bytes);

// "1536 MiB", "2.0 TiB": a byte count for messages.
std::string FormatBytes(int64_t bytes);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_RUNNER_MEMORY_PLAN_H_
