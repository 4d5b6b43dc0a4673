#include "bench/cuda/kernel_timeline.h"

#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

namespace lmserve::bench {
namespace {

struct Cupti {
  decltype(&::cuptiActivityEnable) enable = nullptr;
  decltype(&::cuptiActivityDisable) disable = nullptr;
  decltype(&::cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&::cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&::cuptiActivityGetNextRecord) next_record = nullptr;
};

const Cupti* LoadCupti() {
  static const Cupti* api = []() -> const Cupti* {
    void* lib = nullptr;
    for (const char* name : {"libcupti.so.13", "libcupti.so"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (lib == nullptr) return nullptr;
    auto* c = new Cupti();
    c->enable = reinterpret_cast<decltype(c->enable)>(dlsym(lib, "cuptiActivityEnable"));
    c->disable = reinterpret_cast<decltype(c->disable)>(dlsym(lib, "cuptiActivityDisable"));
    c->register_callbacks = reinterpret_cast<decltype(c->register_callbacks)>(
        dlsym(lib, "cuptiActivityRegisterCallbacks"));
    c->flush_all = reinterpret_cast<decltype(c->flush_all)>(dlsym(lib, "cuptiActivityFlushAll"));
    c->next_record =
        reinterpret_cast<decltype(c->next_record)>(dlsym(lib, "cuptiActivityGetNextRecord"));
    if (!c->enable || !c->disable || !c->register_callbacks || !c->flush_all || !c->next_record) {
      return nullptr;
    }
    return c;
  }();
  return api;
}

std::mutex records_mu;
std::vector<KernelRecord>* records = nullptr;  // guarded by records_mu

std::string ShortName(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : mangled;
  std::free(demangled);
  // "void ns::(anonymous namespace)::Kernel<T, 8>(args)" -> "Kernel<T, 8>"; keep the template
  // arguments (they tell the variants apart) but drop namespaces, parameters, the return type.
  for (const std::string drop : {"(anonymous namespace)::", "void "}) {
    for (size_t at; (at = name.find(drop)) != std::string::npos;) name.erase(at, drop.size());
  }
  int depth = 0;
  size_t cut = name.size();
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '<') ++depth;
    if (name[i] == '>') --depth;
    if (name[i] == '(' && depth == 0 && i > 0) {
      cut = i;
      break;
    }
  }
  name = name.substr(0, cut);
  size_t start = 0;
  depth = 0;
  for (size_t i = 0; i + 1 < name.size(); ++i) {
    if (name[i] == '<') ++depth;
    if (name[i] == '>') --depth;
    if (depth == 0 && name[i] == ':' && name[i + 1] == ':') start = i + 2;
  }
  name = name.substr(start);
  if (name.size() > 90) name = name.substr(0, 90);
  return name;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = size_t{8} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = kBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  const Cupti* api = LoadCupti();
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(records_mu);
  while (api != nullptr && api->next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
      continue;
    }
    const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    if (records != nullptr) {
      records->push_back({ShortName(kernel->name), kernel->start, kernel->end});
    }
  }
  std::free(buffer);
}

}  // namespace

absl::StatusOr<std::unique_ptr<KernelTimeline>> KernelTimeline::Start() {
  const Cupti* api = LoadCupti();
  if (api == nullptr) return absl::UnavailableError("libcupti.so.13 is not loadable here");
  {
    std::lock_guard<std::mutex> lock(records_mu);
    if (records != nullptr) return absl::FailedPreconditionError("a timeline is running");
    records = new std::vector<KernelRecord>();
  }
  if (api->register_callbacks(BufferRequested, BufferCompleted) != CUPTI_SUCCESS ||
      api->enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::lock_guard<std::mutex> lock(records_mu);
    delete records;
    records = nullptr;
    return absl::UnavailableError("CUPTI would not record kernels");
  }
  return std::unique_ptr<KernelTimeline>(new KernelTimeline());
}

KernelTimeline::~KernelTimeline() {
  if (!stopped_) Stop();
}

std::vector<KernelRecord> KernelTimeline::Stop() {
  stopped_ = true;
  const Cupti* api = LoadCupti();
  api->flush_all(1);  // CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
  api->disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  api->flush_all(1);
  std::lock_guard<std::mutex> lock(records_mu);
  std::vector<KernelRecord> out = std::move(*records);
  delete records;
  records = nullptr;
  std::sort(out.begin(), out.end(),
            [](const KernelRecord& a, const KernelRecord& b) { return a.end_ns < b.end_ns; });
  return out;
}

std::vector<KernelShare> Summarize(const std::vector<KernelRecord>& records) {
  std::map<std::string, KernelShare> by_name;
  uint64_t previous_end = records.empty() ? 0 : records.front().start_ns;
  for (const KernelRecord& r : records) {
    KernelShare& share = by_name[r.name];
    share.name = r.name;
    ++share.count;
    share.busy_us += (r.end_ns - r.start_ns) * 1e-3;
    share.critical_us += (r.end_ns - std::min(previous_end, r.end_ns)) * 1e-3;
    previous_end = std::max(previous_end, r.end_ns);
  }
  std::vector<KernelShare> out;
  for (auto& [name, share] : by_name) out.push_back(share);
  std::sort(out.begin(), out.end(), [](const KernelShare& a, const KernelShare& b) {
    return a.critical_us > b.critical_us;
  });
  return out;
}

}  // namespace lmserve::bench
