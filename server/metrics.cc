#include "server/metrics.h"

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/strings.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

// civetweb, behind prometheus-cpp's Exposer, starts its threads with a fixed 100 KiB stack, and
// glibc carves every library's static TLS out of that same stack: OpenBLAS alone takes 60 KiB, the
// CUDA runtime 8 KiB, so the /metrics handler overflowed what was left and the process died on
// the first scrape. This definition interposes on glibc's for the libraries this binary loads:
// explicit stack sizes below 1 MiB are raised to 1 MiB (virtual memory; pages are touched only as
// used).
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stack_size) {
  using Function = int (*)(pthread_attr_t*, size_t);
  static const Function real =
      reinterpret_cast<Function>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  constexpr size_t kMinStackBytes = size_t{1} << 20;
  return real(attr, stack_size < kMinStackBytes ? kMinStackBytes : stack_size);
}

namespace lmserve::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Counter;
using prometheus::Gauge;
using prometheus::Histogram;

// lmserve_engine_step_phase_seconds_total's phase labels.
constexpr std::array<std::string_view, 4> kStepPhases = {"prepare", "launch", "finish", "process"};

// vLLM's time-to-first-token buckets.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,  0.1,
                                          0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,   10.0,
                                          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};

// 1 ms steps up to 10 ms (GPU decode steps), then vLLM's inter-token buckets.
std::vector<double> TokenLatencyBuckets() {
  std::vector<double> buckets;
  for (int ms = 1; ms <= 10; ++ms) buckets.push_back(ms * 0.001);
  for (double b : {0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                   0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}) {
    buckets.push_back(b);
  }
  return buckets;
}

// vLLM's request latency buckets, with finer ones below 0.3 s for small models.
const std::vector<double> kRequestLatencyBuckets = {
    0.01, 0.025, 0.05, 0.1,  0.2,  0.3,  0.5,  0.8,   1.0,   1.5,   2.0,   2.5,   5.0,   10.0,
    15.0, 20.0,  30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

// vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to `max_value`.
std::vector<double> Buckets125(double max_value) {
  std::vector<double> buckets;
  for (double exponent = 1;; exponent *= 10) {
    for (double mantissa : {1.0, 2.0, 5.0}) {
      const double value = mantissa * exponent;
      if (value > max_value) return buckets;
      buckets.push_back(value);
    }
  }
}

// vLLM's iteration-token buckets, up to the step's token budget.
std::vector<double> IterationTokenBuckets(int32_t max_num_batched_tokens) {
  std::vector<double> buckets;
  for (double b : {1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
                   8192.0, 16384.0}) {
    if (b <= max_num_batched_tokens) buckets.push_back(b);
  }
  return buckets;
}

// Adds `count` observations of `mean_value` (their sum `sum`) to `histogram`.
void ObserveMany(Histogram* histogram, const std::vector<double>& buckets, int64_t count,
                 double sum) {
  if (count <= 0) return;
  const double mean = sum / static_cast<double>(count);
  std::vector<double> increments(buckets.size() + 1, 0.0);
  const size_t bucket =
      std::lower_bound(buckets.begin(), buckets.end(), mean) - buckets.begin();
  increments[bucket] = static_cast<double>(count);
  histogram->ObserveMultiple(increments, sum);
}

}  // namespace

std::string_view FrontEndName(FrontEnd front_end) {
  return front_end == FrontEnd::kGrpc ? "grpc" : "http";
}

std::string_view FinishedReasonLabel(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kEos:
    case engine::FinishReason::kStopToken:
    case engine::FinishReason::kStopString:
    case engine::FinishReason::kConstraintEnd:
      return "stop";
    case engine::FinishReason::kMaxTokens:
    case engine::FinishReason::kContextLength:
      return "length";
    case engine::FinishReason::kAborted:
      return "abort";
    case engine::FinishReason::kError:
      return "error";
  }
  return "error";
}

struct Metrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  int port = -1;
  prometheus::Labels labels;

  std::vector<double> token_latency_buckets = TokenLatencyBuckets();
  std::vector<double> iteration_token_buckets;

  // The request histograms, one child per front end (label front_end="grpc" or "http").
  using PerFrontEnd = std::array<Histogram*, kNumFrontEnds>;
  PerFrontEnd ttft{};
  PerFrontEnd itl{};
  PerFrontEnd e2e{};
  PerFrontEnd queue{};
  PerFrontEnd prefill{};
  PerFrontEnd decode{};
  PerFrontEnd request_prompt_tokens{};
  PerFrontEnd request_generation_tokens{};
  Histogram* iteration_tokens = nullptr;
  Histogram* step_duration = nullptr;
  Gauge* running = nullptr;
  Gauge* waiting = nullptr;
  Gauge* kv_usage = nullptr;
  Gauge* kv_blocks = nullptr;
  Gauge* kv_blocks_used = nullptr;
  Gauge* state_slots = nullptr;
  Gauge* state_slots_used = nullptr;
  Gauge* kv_bytes = nullptr;
  prometheus::Family<Gauge>* kv_group_blocks_used_family = nullptr;
  Gauge* weight_bytes = nullptr;
  Gauge* device_memory_used = nullptr;
  Gauge* device_memory_total = nullptr;
  Gauge* startup_seconds = nullptr;
  Counter* prefix_queries = nullptr;
  Counter* prefix_hits = nullptr;
  Counter* preemptions = nullptr;
  Counter* prompt_tokens = nullptr;
  Counter* generation_tokens = nullptr;
  Counter* steps = nullptr;
  // The engine's step time by phase (EngineStats' total_*_seconds), in kStepPhases' order.
  std::array<Counter*, 4> step_phases{};
  prometheus::Family<Counter>* success_family = nullptr;
  std::map<std::string, Counter*, std::less<>> success;  // by finished_reason, made up front
  prometheus::Family<Counter>* rpc_family = nullptr;

  absl::Mutex mu;  // the last engine snapshot and the rpc counters' index
  engine::EngineStats last_stats ABSL_GUARDED_BY(mu);
  std::map<std::pair<std::string, std::string>, Counter*> rpc ABSL_GUARDED_BY(mu);
  prometheus::Family<Counter>* http_family = nullptr;
  std::map<std::pair<std::string, int>, Counter*> http ABSL_GUARDED_BY(mu);
  std::vector<Gauge*> kv_group_blocks_used ABSL_GUARDED_BY(mu);  // by KV cache group

  PerFrontEnd MakeRequestHistogram(const std::string& name, const std::string& help,
                                   const std::vector<double>& buckets) {
    auto& family = BuildHistogram().Name(name).Help(help).Register(*registry);
    PerFrontEnd children{};
    for (int i = 0; i < kNumFrontEnds; ++i) {
      prometheus::Labels front_end_labels = labels;
      front_end_labels["front_end"] = std::string(FrontEndName(static_cast<FrontEnd>(i)));
      children[i] = &family.Add(front_end_labels, buckets);
    }
    return children;
  }
  Histogram* MakeHistogram(const std::string& name, const std::string& help,
                           const std::vector<double>& buckets) {
    return &BuildHistogram().Name(name).Help(help).Register(*registry).Add(labels, buckets);
  }
  Gauge* MakeGauge(const std::string& name, const std::string& help) {
    return &BuildGauge().Name(name).Help(help).Register(*registry).Add(labels);
  }
  Counter* MakeCounter(const std::string& name, const std::string& help) {
    return &BuildCounter().Name(name).Help(help).Register(*registry).Add(labels);
  }
};

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& host, int metrics_port,
                                                         const std::string& model_name,
                                                         int32_t max_model_len,
                                                         int32_t max_num_batched_tokens) {
  auto impl = std::make_unique<Impl>();
  impl->labels = {{"model_name", model_name}};
  impl->iteration_token_buckets = IterationTokenBuckets(max_num_batched_tokens);
  Impl& m = *impl;
  m.ttft = m.MakeRequestHistogram("lmserve_time_to_first_token_seconds",
                           "Histogram of time to first token in seconds.", kTtftBuckets);
  m.itl = m.MakeRequestHistogram("lmserve_inter_token_latency_seconds",
                          "Histogram of inter-token latency in seconds.", m.token_latency_buckets);
  m.e2e = m.MakeRequestHistogram("lmserve_e2e_request_latency_seconds",
                          "Histogram of end to end request latency in seconds.",
                          kRequestLatencyBuckets);
  m.queue = m.MakeRequestHistogram("lmserve_request_queue_time_seconds",
                            "Histogram of time spent in WAITING phase for request.",
                            kRequestLatencyBuckets);
  m.prefill = m.MakeRequestHistogram("lmserve_request_prefill_time_seconds",
                              "Histogram of time spent in PREFILL phase for request.",
                              kRequestLatencyBuckets);
  m.decode = m.MakeRequestHistogram("lmserve_request_decode_time_seconds",
                             "Histogram of time spent in DECODE phase for request.",
                             kRequestLatencyBuckets);
  const std::vector<double> length_buckets = Buckets125(std::max(1, max_model_len));
  m.request_prompt_tokens =
      m.MakeRequestHistogram("lmserve_request_prompt_tokens",
                      "Number of prefill tokens processed.", length_buckets);
  m.request_generation_tokens =
      m.MakeRequestHistogram("lmserve_request_generation_tokens",
                      "Number of generation tokens processed.", length_buckets);
  m.iteration_tokens = m.MakeHistogram("lmserve_iteration_tokens_total",
                                       "Histogram of number of tokens per engine_step.",
                                       m.iteration_token_buckets);
  m.step_duration = m.MakeHistogram("lmserve_engine_step_duration_seconds",
                                    "Histogram of the duration of engine steps in seconds.",
                                    m.token_latency_buckets);
  m.running = m.MakeGauge("lmserve_num_requests_running",
                          "Number of requests in model execution batches.");
  m.waiting = m.MakeGauge("lmserve_num_requests_waiting", "Number of requests waiting to be processed.");
  m.kv_usage = m.MakeGauge("lmserve_kv_cache_usage_perc",
                           "KV-cache usage. 1 means 100 percent usage.");
  m.kv_blocks = m.MakeGauge("lmserve_kv_cache_blocks", "KV-cache blocks in the pool.");
  m.kv_blocks_used = m.MakeGauge("lmserve_kv_cache_used_blocks",
                                 "KV-cache blocks referenced by running or waiting requests.");
  m.kv_bytes = m.MakeGauge("lmserve_kv_cache_bytes", "Memory of the KV-cache pool in bytes.");
  m.state_slots = m.MakeGauge(
      "lmserve_state_slots",
      "Recurrent-state slots of state-space (Mamba) layers in the pool (0: the model has none).");
  m.state_slots_used = m.MakeGauge("lmserve_state_slots_used",
                                   "Recurrent-state slots held by running sequences.");
  m.kv_group_blocks_used_family =
      &BuildGauge()
           .Name("lmserve_kv_cache_group_used_blocks")
           .Help(
               "KV-cache blocks referenced by each group of layers (kv_group: its index; window: "
               "its sliding window in tokens, 0 for full attention); they sum to "
               "lmserve_kv_cache_used_blocks.")
           .Register(*m.registry);
  m.weight_bytes = m.MakeGauge("lmserve_model_weight_bytes",
                               "Memory of the model weights, as the runner holds them, in bytes.");
  m.device_memory_used = m.MakeGauge(
      "lmserve_gpu_memory_used_bytes",
      "GPU memory in use on the device after start-up (every allocation is made then); 0 on CPU.");
  m.device_memory_total = m.MakeGauge("lmserve_gpu_memory_total_bytes",
                                      "The GPU's memory in bytes; 0 on CPU.");
  m.startup_seconds = m.MakeGauge("lmserve_runner_startup_seconds",
                                  "Time to build the model runner (weights, KV cache, CUDA graphs).");
  m.prefix_queries = m.MakeCounter(
      "lmserve_prefix_cache_queries_total",
      "Prefix cache queries, in terms of number of queried tokens.");
  m.prefix_hits = m.MakeCounter("lmserve_prefix_cache_hits_total",
                                "Prefix cache hits, in terms of number of cached tokens.");
  m.preemptions = m.MakeCounter("lmserve_num_preemptions_total",
                                "Cumulative number of preemption from the engine.");
  m.prompt_tokens = m.MakeCounter("lmserve_prompt_tokens_total",
                                  "Number of prefill tokens processed.");
  m.generation_tokens = m.MakeCounter("lmserve_generation_tokens_total",
                                      "Number of generation tokens processed.");
  m.steps = m.MakeCounter("lmserve_engine_steps_total", "Number of engine steps run.");
  auto& phase_family =
      BuildCounter()
          .Name("lmserve_engine_step_phase_seconds_total")
          .Help("Engine step time by phase: prepare (scheduling and the batch, before the launch) "
                "and process (each sequence's token, outputs emitted, after the step) are host "
                "work with no forward pass of this engine running; launch and finish are the "
                "runner's halves (a GPU runner's finish waits for the step's end).")
          .Register(*m.registry);
  for (size_t i = 0; i < kStepPhases.size(); ++i) {
    prometheus::Labels labels = m.labels;
    labels["phase"] = std::string(kStepPhases[i]);
    m.step_phases[i] = &phase_family.Add(labels);
  }
  m.success_family = &BuildCounter()
                          .Name("lmserve_request_success_total")
                          .Help("Count of successfully processed requests.")
                          .Register(*m.registry);
  for (std::string_view reason : {"stop", "length", "abort", "error"}) {
    prometheus::Labels labels = m.labels;
    labels["finished_reason"] = std::string(reason);
    m.success.emplace(std::string(reason), &m.success_family->Add(labels));
  }
  m.rpc_family = &BuildCounter()
                      .Name("lmserve_grpc_server_handled_total")
                      .Help("gRPC calls completed, by method and status code.")
                      .Register(*m.registry);
  m.http_family = &BuildCounter()
                       .Name("lmserve_http_requests_total")
                       .Help("HTTP requests answered, by route and status code (499: the client "
                             "went away before the response ended).")
                       .Register(*m.registry);

  if (metrics_port >= 0) {
    const std::string address =
        host.find(':') != std::string::npos && host.front() != '['
            ? StrCat("[", host, "]:", metrics_port)
            : StrCat(host, ":", metrics_port);
    try {
      // civetweb's options (prometheus-cpp passes them through): kMetricsHttpWorkers threads,
      // each giving up on a connection that has not sent its request within
      // kMetricsRequestTimeoutMs (civetweb's default is 30 s, and a single worker let one idle TCP
      // connection blind /metrics that long, renewable forever). Keep-alive stays off: each
      // connection serves one scrape and is closed.
      m.exposer = std::make_unique<prometheus::Exposer>(
          std::vector<std::string>{"listening_ports", address,                              //
                                   "num_threads", StrCat(kMetricsHttpWorkers),              //
                                   "request_timeout_ms", StrCat(kMetricsRequestTimeoutMs),  //
                                   "enable_keep_alive", "no"});
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          StrCat("--metrics-port: cannot serve metrics on ", address, ": ", e.what()));
    }
    m.exposer->RegisterCollectable(m.registry);
    const std::vector<int> ports = m.exposer->GetListeningPorts();
    m.port = ports.empty() ? metrics_port : ports.front();
  }
  return std::unique_ptr<Metrics>(new Metrics(std::move(impl)));
}

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() = default;

int Metrics::port() const { return impl_->port; }

void Metrics::ObserveTimeToFirstToken(FrontEnd front_end, double seconds) {
  impl_->ttft[static_cast<int>(front_end)]->Observe(seconds);
}
void Metrics::ObserveInterTokenLatency(FrontEnd front_end, double seconds) {
  impl_->itl[static_cast<int>(front_end)]->Observe(seconds);
}
void Metrics::AddGenerationTokens(int64_t count) {
  if (count > 0) impl_->generation_tokens->Increment(static_cast<double>(count));
}
void Metrics::AddPromptTokens(int64_t count) {
  if (count > 0) impl_->prompt_tokens->Increment(static_cast<double>(count));
}

void Metrics::CountFinishedChoice(engine::FinishReason reason) {
  impl_->success.find(FinishedReasonLabel(reason))->second->Increment();
}

void Metrics::ObserveFinishedRequest(FrontEnd front_end, const FinishedRequestStats& stats) {
  const engine::RequestTimings& t = stats.timings;
  const int i = static_cast<int>(front_end);
  impl_->e2e[i]->Observe(t.finish_seconds);
  impl_->queue[i]->Observe(t.queue_seconds);
  if (stats.has_first_token) {
    impl_->prefill[i]->Observe(std::max(0.0, t.first_token_seconds - t.queue_seconds));
    impl_->decode[i]->Observe(std::max(0.0, t.finish_seconds - t.first_token_seconds));
  }
  impl_->request_prompt_tokens[i]->Observe(stats.prompt_tokens);
  impl_->request_generation_tokens[i]->Observe(stats.generation_tokens);
}

void Metrics::CountHttpRequest(std::string_view route, int status_code) {
  Counter* counter;
  {
    absl::MutexLock lock(&impl_->mu);
    auto key = std::make_pair(std::string(route), status_code);
    auto it = impl_->http.find(key);
    if (it == impl_->http.end()) {
      prometheus::Labels labels = impl_->labels;
      labels["route"] = key.first;
      labels["code"] = StrCat(status_code);
      it = impl_->http.emplace(std::move(key), &impl_->http_family->Add(labels)).first;
    }
    counter = it->second;
  }
  counter->Increment();
}

void Metrics::CountRpc(std::string_view method, std::string_view code) {
  Counter* counter;
  {
    absl::MutexLock lock(&impl_->mu);
    auto key = std::make_pair(std::string(method), std::string(code));
    auto it = impl_->rpc.find(key);
    if (it == impl_->rpc.end()) {
      prometheus::Labels labels = impl_->labels;
      labels["grpc_method"] = key.first;
      labels["grpc_code"] = key.second;
      it = impl_->rpc.emplace(std::move(key), &impl_->rpc_family->Add(labels)).first;
    }
    counter = it->second;
  }
  counter->Increment();
}

void Metrics::SetRunnerStats(const engine::RunnerStats& stats) {
  Impl& m = *impl_;
  m.kv_bytes->Set(static_cast<double>(stats.kv_cache_bytes));
  m.weight_bytes->Set(static_cast<double>(stats.weight_bytes));
  m.device_memory_used->Set(static_cast<double>(stats.device_memory_used_bytes));
  m.device_memory_total->Set(static_cast<double>(stats.device_memory_total_bytes));
  m.startup_seconds->Set(stats.startup_seconds);
}

void Metrics::UpdateEngineStats(const engine::EngineStats& stats) {
  Impl& m = *impl_;
  m.running->Set(stats.num_running_seqs);
  m.waiting->Set(stats.num_waiting_seqs);
  m.kv_usage->Set(stats.kv_cache_usage);
  m.kv_blocks->Set(stats.num_kv_blocks);
  m.kv_blocks_used->Set(stats.num_kv_blocks - stats.num_free_kv_blocks);
  m.state_slots->Set(stats.num_state_slots);
  m.state_slots_used->Set(stats.num_used_state_slots);
  absl::MutexLock lock(&m.mu);
  // The groups are fixed by the model: their gauges are made at the first snapshot.
  for (size_t g = m.kv_group_blocks_used.size(); g < stats.kv_groups.size(); ++g) {
    prometheus::Labels labels = m.labels;
    labels["kv_group"] = StrCat(g);
    labels["window"] = StrCat(stats.kv_groups[g].window);
    m.kv_group_blocks_used.push_back(&m.kv_group_blocks_used_family->Add(labels));
  }
  for (size_t g = 0; g < stats.kv_groups.size(); ++g) {
    m.kv_group_blocks_used[g]->Set(stats.kv_groups[g].num_used_blocks);
  }
  const engine::EngineStats& last = m.last_stats;
  auto add = [](Counter* counter, int64_t delta) {
    if (delta > 0) counter->Increment(static_cast<double>(delta));
  };
  add(m.prefix_queries, stats.prefix_cache_queried_tokens - last.prefix_cache_queried_tokens);
  add(m.prefix_hits, stats.prefix_cache_hit_tokens - last.prefix_cache_hit_tokens);
  add(m.preemptions, stats.num_preemptions - last.num_preemptions);
  const int64_t new_steps = stats.num_steps - last.num_steps;
  if (new_steps > 0) {
    add(m.steps, new_steps);
    ObserveMany(m.step_duration, m.token_latency_buckets, new_steps,
                stats.total_step_seconds - last.total_step_seconds);
    ObserveMany(m.iteration_tokens, m.iteration_token_buckets, new_steps,
                static_cast<double>(stats.total_step_tokens - last.total_step_tokens));
  }
  const std::array<double, 4> phases = {
      stats.total_prepare_seconds - last.total_prepare_seconds,
      stats.total_launch_seconds - last.total_launch_seconds,
      stats.total_finish_seconds - last.total_finish_seconds,
      stats.total_process_seconds - last.total_process_seconds};
  for (size_t i = 0; i < phases.size(); ++i) {
    if (phases[i] > 0.0) m.step_phases[i]->Increment(phases[i]);
  }
  m.last_stats = stats;
}

}  // namespace lmserve::server
