// `lmserve-bench serve`: measures a serving system as vLLM's benchmark_serving does.
//
// Load: requests arrive at --request-rate per second (Poisson arrivals; --burstiness b draws the
// gaps from a gamma distribution of shape b and the same mean, b = 1 being Poisson), at most
// --max-concurrency in flight; --concurrency N is the closed loop "rate inf, N in flight".
// Warm-up requests (--warmup-requests) run first and are not counted; the server's /metrics
// (--metrics-url) are scraped after them and after the run, so both sides cover the same requests.
//
// Bounds: issuing stops after --num-prompts requests or at --duration-s, whichever comes first.
// Requests still in flight at the bound may finish within --grace-s; those that do are counted in
// full; the rest are cancelled and counted as failed ("in flight at the end"), never dropped. The
// run's duration is from the first request's send to the last one's end (or the cancellation).

#include "bench/lmserve_bench/serve.h"

#include <curl/curl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string_view>
#include <thread>

#include "bench/lmserve_bench/client.h"
#include "bench/lmserve_bench/dataset.h"
#include "bench/lmserve_bench/prometheus_text.h"
#include "bench/lmserve_bench/stats.h"
#include "common/file.h"
#include "common/hash.h"
#include "common/status.h"
#include "common/strings.h"
#include "server/command_line.h"

namespace lmserve::bench {
namespace {

constexpr char kCancelledAtBound[] = "in flight at the end (duration bound + grace): cancelled";
constexpr char kTtftHistogram[] = "lmserve_time_to_first_token_seconds";

struct LoadSpec {
  double request_rate = std::numeric_limits<double>::infinity();  // requests per second
  double burstiness = 1;
  int64_t max_concurrency = 0;  // 0: unlimited
  int64_t num_requests = 0;
  double duration_seconds = 0;  // 0: no bound
  double grace_seconds = 30;
  uint64_t seed = 0;
};

struct LoadResult {
  std::vector<RequestRecord> records;  // one per issued request, in issue order
  double duration_seconds = 0;
  int64_t num_cancelled_at_bound = 0;
};

// Issues requests by `spec` and waits for them (see the file comment for the bounds).
LoadResult RunLoad(Client* client, const std::vector<Prompt>& prompts, const LoadSpec& spec) {
  std::mutex mu;
  std::condition_variable changed;
  int64_t in_flight = 0;
  std::vector<RequestRecord> records;
  records.reserve(static_cast<size_t>(std::min<int64_t>(spec.num_requests, 4096)));

  std::mt19937_64 generator(spec.seed);
  std::gamma_distribution<double> gap(spec.burstiness, 1.0 / (spec.request_rate * spec.burstiness));
  const bool open_loop = std::isfinite(spec.request_rate);
  const double start = NowSeconds();
  const double bound = spec.duration_seconds > 0 ? start + spec.duration_seconds
                                                 : std::numeric_limits<double>::infinity();
  auto until = [](double seconds) {
    return std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(seconds)));
  };
  double next_arrival = start;
  for (int64_t i = 0; i < spec.num_requests; ++i) {
    if (open_loop) {
      if (i > 0) next_arrival += gap(generator);
      const double wake = std::min(next_arrival, bound);
      if (std::isfinite(wake)) std::this_thread::sleep_until(until(wake));
    }
    if (NowSeconds() >= bound) break;
    {
      std::unique_lock<std::mutex> lock(mu);
      auto has_room = [&] { return spec.max_concurrency <= 0 || in_flight < spec.max_concurrency; };
      if (std::isfinite(bound)) {
        changed.wait_until(lock, until(bound), has_room);
      } else {
        changed.wait(lock, has_room);
      }
      if (!has_room() || NowSeconds() >= bound) break;
      ++in_flight;
      records.emplace_back();
    }
    const size_t index = static_cast<size_t>(i);
    client->Start(prompts[index % prompts.size()], [&, index](RequestRecord record) {
      std::lock_guard<std::mutex> lock(mu);
      records[index] = std::move(record);
      --in_flight;
      changed.notify_all();
    });
  }

  LoadResult result;
  std::unique_lock<std::mutex> lock(mu);
  if (std::isfinite(bound)) {
    const double give_up = std::max(bound, NowSeconds()) + spec.grace_seconds;
    if (!changed.wait_until(lock, until(give_up), [&] { return in_flight == 0; })) {
      result.num_cancelled_at_bound = in_flight;
      lock.unlock();
      client->CancelAll();
      lock.lock();
    }
  }
  changed.wait(lock, [&] { return in_flight == 0; });
  double last_end = start;
  for (RequestRecord& record : records) {
    last_end = std::max(last_end, record.end_time);
  }
  for (RequestRecord& record : records) {
    if (!record.success && record.error == kCancelledByClient) record.error = kCancelledAtBound;
  }
  result.records = std::move(records);
  result.duration_seconds = last_end - start;
  return result;
}

nlohmann::json DistributionJson(const Distribution& d) {
  nlohmann::json j = {
      {"count", d.count}, {"mean", d.mean}, {"std", d.stddev}, {"min", d.min}, {"max", d.max}};
  for (const auto& [p, value] : d.percentiles) j[StrCat("p", p)] = value;
  return j;
}

void PrintLine(const std::string& label, const std::string& value) {
  std::printf("%-42s %s\n", label.c_str(), value.c_str());
}

std::string Fixed(double value, int digits = 2) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", digits, value);
  return buffer;
}

void PrintDistribution(const std::string& title, const std::string& name, const Distribution& d) {
  std::printf("%s\n", StrCat("---------------", title, "---------------").c_str());
  PrintLine(StrCat("Mean ", name, " (ms):"), Fixed(d.mean));
  for (const auto& [p, value] : d.percentiles) {
    PrintLine(StrCat(p == 50 ? "Median" : StrCat("P", p), " ", name, " (ms):"), Fixed(value));
  }
}

struct ServerTtft {
  bool measured = false;
  double mean_seconds = 0;
  double count = 0;
  std::string error;
};

// What the run changed in the server's counters (after minus before).
struct ServerDeltas {
  HistogramTotals ttft;
  double prefix_cache_queries = 0;  // prompt tokens looked up in the prefix cache
  double prefix_cache_hits = 0;     // of which found: repeated prompts would skew TTFT low
  double steps = 0;
  // lmserve_engine_step_phase_seconds_total by kStepPhases: prepare and process are the host's
  // time with no forward pass of the engine running.
  std::array<double, 4> step_phase_seconds{};
};

constexpr std::array<std::string_view, 4> kStepPhases = {"prepare", "launch", "finish", "process"};

absl::StatusOr<ServerDeltas> Scrape(const std::string& url) {
  LMSERVE_ASSIGN_OR_RETURN(std::string text, HttpGet(url, 10));
  ServerDeltas values;
  values.ttft = ReadHistogram(text, kTtftHistogram);
  values.prefix_cache_queries = SumSamples(text, "lmserve_prefix_cache_queries_total");
  values.prefix_cache_hits = SumSamples(text, "lmserve_prefix_cache_hits_total");
  values.steps = SumSamples(text, "lmserve_engine_steps_total");
  for (size_t i = 0; i < kStepPhases.size(); ++i) {
    values.step_phase_seconds[i] = SumSamples(text, "lmserve_engine_step_phase_seconds_total",
                                              StrCat("phase=\"", kStepPhases[i], "\""));
  }
  return values;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "lmserve-bench serve: %s\n", message.c_str());
  return 2;
}

// What `lmserve-bench serve`'s flags say.
struct ServeFlags {
  std::string backend = "grpc";
  std::string addr = "127.0.0.1:50051";
  std::string url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string model;
  bool no_return_token_ids = false;
  std::optional<std::string> token_file;
  int64_t channels = 4;
  std::optional<std::string> dataset;
  int64_t input_len = 128;
  int64_t output_len = 128;
  double range_ratio = 0;
  std::optional<int64_t> vocab_size;
  int64_t first_token_id = 100;
  std::optional<int64_t> num_prompts;
  std::optional<int64_t> concurrency;
  double request_rate = std::numeric_limits<double>::infinity();
  std::string request_rate_text = "inf";  // as given, for the summary
  double burstiness = 1;
  int64_t max_concurrency = 0;
  double duration_seconds = 0;
  double grace_seconds = 30;
  std::optional<int64_t> warmup_requests;
  double request_timeout_seconds = 0;
  double temperature = 0;
  bool no_ignore_eos = false;
  std::string goodput;
  std::string percentiles = "50,90,99";
  std::string metrics_url;
  double wait_ready_seconds = 0;
  int64_t seed = 0;
  std::optional<std::string> result_json;
  std::string label;
};

void BindServeFlags(CLI::App* command, ServeFlags* flags) {
  using server::AddDoubleFlag;
  using server::AddIntFlag;
  using server::AddStringFlag;
  server::AddChoiceFlag<std::string>(
      command, "--backend", &flags->backend,
      [](std::string_view name) -> std::optional<std::string> {
        if (name == "grpc" || name == "http") return std::string(name);
        return std::nullopt;
      },
      "grpc, http", flags->backend,
      "grpc (lmserve's API) or http (an OpenAI-compatible /v1/completions)");
  AddStringFlag(command, "--addr", &flags->addr, "grpc: the server, HOST:PORT");
  AddStringFlag(command, "--url", &flags->url, "http: the base URL");
  AddStringFlag(command, "--endpoint", &flags->endpoint, "http: the completions path");
  AddStringFlag(command, "--model", &flags->model,
                "http: the model name to send (default: the first one GET /v1/models lists)");
  server::AddBoolFlag(command, "--no-return-token-ids", &flags->no_return_token_ids,
                      "http: do not ask for token ids in the stream (vLLM's return_token_ids; "
                      "without them tokens are counted from usage, else one per chunk)");
  AddStringFlag(command, "--token-file", &flags->token_file,
                "send 'authorization: Bearer <token>', the token read from this file");
  AddIntFlag(command, "--channels", &flags->channels, "grpc: connections to spread requests over");
  AddStringFlag(command, "--dataset", &flags->dataset,
                "a JSONL file: {\"prompt\": TEXT | \"prompt_token_ids\": [...], "
                "\"output_len\": N} per line (default: synthetic token-id prompts)");
  AddIntFlag(command, "--input-len", &flags->input_len, "synthetic: prompt tokens");
  AddIntFlag(command, "--output-len", &flags->output_len,
             "synthetic: output tokens (and the default for dataset lines)");
  AddDoubleFlag(command, "--range-ratio", &flags->range_ratio,
                "synthetic: lengths uniform in len*(1-r)..len*(1+r)");
  AddIntFlag(command, "--vocab-size", &flags->vocab_size,
             "synthetic: draw ids below this (default: grpc asks the server)");
  AddIntFlag(command, "--first-token-id", &flags->first_token_id,
             "synthetic: draw ids from this one up (skips special tokens)");
  AddIntFlag(command, "--num-prompts", &flags->num_prompts,
             "requests to issue (default: 100, or unbounded with --duration-s)");
  AddIntFlag(command, "--concurrency", &flags->concurrency,
             "a closed loop: N requests in flight (rate inf)");
  command
      ->add_option_function<std::string>(
          "--request-rate",
          [flags](const std::string& text) {
            flags->request_rate = server::ParseDoubleFlag("--request-rate", text);
            flags->request_rate_text = text;
          },
          "requests per second (Poisson arrivals); inf: all at once")
      ->type_name("NUMBER")
      ->default_str("inf");
  AddDoubleFlag(command, "--burstiness", &flags->burstiness,
                "gamma shape of the arrival gaps: 1 Poisson, < 1 burstier");
  AddIntFlag(command, "--max-concurrency", &flags->max_concurrency,
             "with --request-rate: at most N in flight; 0: no limit");
  AddDoubleFlag(command, "--duration-s", &flags->duration_seconds,
                "stop issuing after this many seconds; 0: no bound");
  AddDoubleFlag(command, "--grace-s", &flags->grace_seconds,
                "with --duration-s: wait this long for requests in flight");
  AddIntFlag(command, "--warmup-requests", &flags->warmup_requests,
             "requests run first and not counted (default: the concurrency, else 4)");
  AddDoubleFlag(command, "--request-timeout-s", &flags->request_timeout_seconds,
                "each request's deadline; 0: none");
  AddDoubleFlag(command, "--temperature", &flags->temperature, "sampling temperature (0: greedy)");
  server::AddBoolFlag(command, "--no-ignore-eos", &flags->no_ignore_eos,
                      "let the model stop at EOS (outputs may be shorter than asked)");
  AddStringFlag(command, "--goodput", &flags->goodput,
                "SLOs in ms for goodput, e.g. 'ttft:500 tpot:50' (ttft, tpot, e2el)");
  AddStringFlag(command, "--percentiles", &flags->percentiles, "the percentiles to report");
  AddStringFlag(command, "--metrics-url", &flags->metrics_url,
                "the server's Prometheus /metrics, scraped before and after the run: the "
                "server's TTFT mean is compared with the client's");
  AddDoubleFlag(command, "--wait-ready-s", &flags->wait_ready_seconds,
                "first wait up to this long for the server to be ready");
  AddIntFlag(command, "--seed", &flags->seed, "seeds the synthetic prompts and the arrivals");
  AddStringFlag(command, "--result-json", &flags->result_json,
                "write the results to this JSON file");
  AddStringFlag(command, "--label", &flags->label,
                "a label recorded in the JSON (e.g. the sweep point)");
}

int RunServe(const ServeFlags& flags, const std::string& command_line) {
  // Once, before any thread starts; never cleaned up (the process ends with the benchmark).
  curl_global_init(CURL_GLOBAL_DEFAULT);

  ClientOptions options;
  const std::string& backend = flags.backend;
  if (backend == "grpc") {
    options.target = flags.addr;
  } else {
    options.target = flags.url;
    options.endpoint = flags.endpoint;
    options.model = flags.model;
    options.return_token_ids = !flags.no_return_token_ids;
  }
  if (flags.token_file.has_value()) {
    absl::StatusOr<std::string> contents = ReadFile(*flags.token_file);
    if (!contents.ok()) return Usage(StrCat("--token-file: ", contents.status().message()));
    options.token = contents->substr(0, contents->find('\n'));  // the first line
    while (!options.token.empty() &&
           (options.token.back() == '\r' || options.token.back() == ' ')) {
      options.token.pop_back();
    }
  }
  options.num_channels = static_cast<int32_t>(flags.channels);
  options.temperature = flags.temperature;
  options.ignore_eos = !flags.no_ignore_eos;
  options.request_timeout_seconds = flags.request_timeout_seconds;

  LoadSpec load;
  load.seed = static_cast<uint64_t>(flags.seed);
  load.duration_seconds = flags.duration_seconds;
  load.grace_seconds = flags.grace_seconds;
  if (flags.concurrency.has_value()) {
    if (flags.max_concurrency != 0) {
      return Usage("give --concurrency or --max-concurrency, not both");
    }
    load.max_concurrency = *flags.concurrency;
    if (load.max_concurrency < 1) return Usage("--concurrency: want >= 1");
    if (std::isfinite(flags.request_rate)) {
      return Usage(
          "--concurrency is a closed loop: leave --request-rate at inf, or use "
          "--max-concurrency");
    }
  } else {
    load.max_concurrency = flags.max_concurrency;
  }
  load.request_rate = flags.request_rate;
  load.burstiness = flags.burstiness;
  if (!(load.request_rate > 0) || !(load.burstiness > 0)) {
    return Usage("--request-rate and --burstiness must be > 0");
  }
  if (flags.num_prompts.has_value()) {
    load.num_requests = *flags.num_prompts;
    if (load.num_requests < 1) return Usage("--num-prompts: want >= 1");
  } else {
    load.num_requests = load.duration_seconds > 0 ? std::numeric_limits<int64_t>::max() : 100;
  }
  absl::StatusOr<Slos> slos = ParseSlos(flags.goodput);
  if (!slos.ok()) return Usage(std::string(slos.status().message()));
  std::vector<int> percentiles;
  for (std::string_view piece : StrSplit(flags.percentiles, ',')) {
    std::optional<int> p = ParseInt<int>(piece);
    if (!p || *p < 0 || *p > 100) return Usage("--percentiles: want integers in [0, 100]");
    percentiles.push_back(*p);
  }
  const int64_t warmup_requests =
      flags.warmup_requests.value_or(load.max_concurrency > 0 ? load.max_concurrency : 4);

  absl::StatusOr<std::unique_ptr<Client>> client =
      backend == "grpc" ? CreateGrpcClient(options) : CreateHttpClient(options);
  if (!client.ok()) return Usage(std::string(client.status().message()));
  if (const double wait = flags.wait_ready_seconds; wait > 0) {
    if (absl::Status ready = (*client)->WaitReady(wait); !ready.ok()) {
      std::fprintf(stderr, "lmserve-bench serve: %s\n", std::string(ready.message()).c_str());
      return 1;
    }
  }

  if (backend == "http") {
    absl::StatusOr<std::string> model = (*client)->Model();
    if (!model.ok()) {
      std::fprintf(stderr, "lmserve-bench serve: %s\n",
                   std::string(model.status().message()).c_str());
      return 1;
    }
    options.model = *model;
  }

  // Prompts: the measured ones and, separately, the warm-up's (so that warm-up does not fill the
  // prefix cache with the measured prompts).
  const int32_t output_len = static_cast<int32_t>(flags.output_len);
  std::vector<Prompt> prompts, warmup_prompts;
  std::string dataset_name;
  if (flags.dataset.has_value()) {
    absl::StatusOr<std::vector<Prompt>> read = ReadJsonlDataset(*flags.dataset, output_len);
    if (!read.ok()) return Usage(std::string(read.status().message()));
    prompts = std::move(*read);
    // Warm-up takes the dataset's last prompts, the measured run its first: they share no prompt
    // (and so no prefix-cache entry) when the dataset is long enough. The JSON reports the
    // server's prefix-cache hits either way.
    warmup_prompts.assign(prompts.rbegin(), prompts.rend());
    dataset_name = *flags.dataset;
  } else {
    SyntheticSpec spec;
    spec.input_len = static_cast<int32_t>(flags.input_len);
    spec.output_len = output_len;
    spec.range_ratio = flags.range_ratio;
    spec.first_id = static_cast<int32_t>(flags.first_token_id);
    spec.seed = load.seed;
    if (flags.vocab_size.has_value()) {
      spec.vocab_size = static_cast<int32_t>(*flags.vocab_size);
    } else {
      absl::StatusOr<int32_t> vocab = (*client)->VocabSize();
      if (!vocab.ok()) {
        std::fprintf(stderr, "lmserve-bench serve: %s\n",
                     std::string(vocab.status().message()).c_str());
        return 1;
      }
      spec.vocab_size = *vocab;
    }
    spec.first_id = std::min(spec.first_id, spec.vocab_size / 2);  // tiny test vocabularies
    // Unbounded runs cycle through a pool of prompts.
    spec.num_prompts = static_cast<int32_t>(std::min<int64_t>(load.num_requests, 4096));
    absl::StatusOr<std::vector<Prompt>> made = MakeSyntheticDataset(spec);
    if (!made.ok()) return Usage(std::string(made.status().message()));
    prompts = std::move(*made);
    spec.seed = load.seed + kGoldenGamma;
    spec.num_prompts = static_cast<int32_t>(std::max<int64_t>(warmup_requests, 1));
    warmup_prompts = std::move(*MakeSyntheticDataset(spec));
    dataset_name =
        StrCat("synthetic (input ", spec.input_len, ", output ", spec.output_len, ", range ratio ",
               spec.range_ratio, ", ids in [", spec.first_id, ", ", spec.vocab_size, "))");
  }

  if (warmup_requests > 0) {
    LoadSpec warmup;
    warmup.num_requests = warmup_requests;
    warmup.max_concurrency = load.max_concurrency > 0 ? load.max_concurrency : warmup_requests;
    LoadResult warm = RunLoad(client->get(), warmup_prompts, warmup);
    int64_t failed = 0;
    std::string error;
    for (const RequestRecord& record : warm.records) {
      if (!record.success) {
        ++failed;
        error = record.error;
      }
    }
    std::fprintf(stderr, "lmserve-bench serve: warm-up: %lld requests, %lld failed%s\n",
                 static_cast<long long>(warmup_requests), static_cast<long long>(failed),
                 failed > 0 ? StrCat(" (", error, ")").c_str() : "");
    if (failed == warmup_requests) return 1;
  }

  const std::string& metrics_url = flags.metrics_url;
  absl::StatusOr<ServerDeltas> metrics_before = absl::UnavailableError("not scraped");
  if (!metrics_url.empty()) metrics_before = Scrape(metrics_url);

  LoadResult run = RunLoad(client->get(), prompts, load);

  ServerTtft server_ttft;
  ServerDeltas deltas;
  if (!metrics_url.empty()) {
    absl::StatusOr<ServerDeltas> after = Scrape(metrics_url);
    if (!metrics_before.ok() || !after.ok()) {
      server_ttft.error =
          std::string((!metrics_before.ok() ? metrics_before.status() : after.status()).message());
    } else {
      deltas.ttft.count = after->ttft.count - metrics_before->ttft.count;
      deltas.ttft.sum = after->ttft.sum - metrics_before->ttft.sum;
      deltas.prefix_cache_queries =
          after->prefix_cache_queries - metrics_before->prefix_cache_queries;
      deltas.prefix_cache_hits = after->prefix_cache_hits - metrics_before->prefix_cache_hits;
      deltas.steps = after->steps - metrics_before->steps;
      for (size_t i = 0; i < kStepPhases.size(); ++i) {
        deltas.step_phase_seconds[i] =
            after->step_phase_seconds[i] - metrics_before->step_phase_seconds[i];
      }
      server_ttft.count = deltas.ttft.count;
      if (server_ttft.count > 0) {
        server_ttft.measured = true;
        server_ttft.mean_seconds = deltas.ttft.sum / server_ttft.count;
      } else {
        server_ttft.error = StrCat("no ", kTtftHistogram, " observations during the run");
      }
    }
  }

  const BenchmarkSummary summary = Summarize(run.records, run.duration_seconds, *slos, percentiles);
  const TokenCounting counting = (*client)->token_counting();

  std::printf("============ Serving Benchmark Result ============\n");
  PrintLine("Backend:",
            StrCat(backend, " (", options.target, backend == "http" ? options.endpoint : "", ")"));
  PrintLine("Load:", load.max_concurrency > 0 && !std::isfinite(load.request_rate)
                         ? StrCat("concurrency ", load.max_concurrency)
                         : StrCat("rate ", flags.request_rate_text, " req/s, burstiness ",
                                  load.burstiness, ", max concurrency ", load.max_concurrency));
  PrintLine("Issued requests:", StrCat(summary.num_issued));
  PrintLine("Successful requests:", StrCat(summary.num_completed));
  PrintLine("Failed requests:", StrCat(summary.num_failed));
  for (const auto& [error, count] : summary.errors) PrintLine(StrCat("  ", count, " x"), error);
  PrintLine("Benchmark duration (s):", Fixed(summary.duration_seconds));
  PrintLine("Total input tokens:", StrCat(summary.total_input_tokens));
  PrintLine("Total generated tokens:", StrCat(summary.total_output_tokens));
  PrintLine("Output tokens counted by:", TokenCountingName(counting));
  PrintLine("Request throughput (req/s):", Fixed(summary.request_throughput));
  if (!slos->empty()) PrintLine("Request goodput (req/s):", Fixed(summary.goodput));
  PrintLine("Output token throughput (tok/s):", Fixed(summary.output_throughput));
  PrintLine("Total token throughput (tok/s):", Fixed(summary.total_token_throughput));
  PrintDistribution("Time to First Token", "TTFT", summary.ttft_ms);
  PrintDistribution("Time per Output Token (excl. 1st token)", "TPOT", summary.tpot_ms);
  PrintDistribution("Inter-token Latency", "ITL", summary.itl_ms);
  PrintDistribution("End-to-end Latency", "E2EL", summary.e2el_ms);
  double relative_difference = 0;
  if (!metrics_url.empty()) {
    std::printf("---------------Server-side (Prometheus)---------------\n");
    if (server_ttft.measured) {
      relative_difference = (summary.ttft_ms.mean - server_ttft.mean_seconds * 1e3) /
                            (server_ttft.mean_seconds * 1e3);
      PrintLine("Server mean TTFT (ms):", Fixed(server_ttft.mean_seconds * 1e3));
      PrintLine("Server TTFT observations:", StrCat(static_cast<int64_t>(server_ttft.count)));
      PrintLine("Client vs server mean TTFT:", StrCat(Fixed(relative_difference * 100), " %"));
      PrintLine("Server prefix cache hits (tokens):",
                StrCat(static_cast<int64_t>(deltas.prefix_cache_hits), " of ",
                       static_cast<int64_t>(deltas.prefix_cache_queries)));
    } else {
      PrintLine("Server mean TTFT:", StrCat("not measured: ", server_ttft.error));
    }
    if (server_ttft.measured && deltas.steps > 0) {
      PrintLine("Server engine steps:", StrCat(static_cast<int64_t>(deltas.steps)));
      for (size_t i = 0; i < kStepPhases.size(); ++i) {
        PrintLine(
            StrCat("Server step ", kStepPhases[i], " (s, % of run):"),
            StrCat(Fixed(deltas.step_phase_seconds[i]), " (",
                   Fixed(100 * deltas.step_phase_seconds[i] / summary.duration_seconds), " %)"));
      }
    }
  }
  std::printf("==================================================\n");
  std::fflush(stdout);

  if (flags.result_json.has_value()) {
    const std::string& command = command_line;
    nlohmann::json config = {
        {"backend", backend},
        {"target", options.target},
        {"dataset", dataset_name},
        {"num_prompts_limit", load.num_requests == std::numeric_limits<int64_t>::max()
                                  ? nlohmann::json(nullptr)
                                  : nlohmann::json(load.num_requests)},
        {"request_rate", std::isfinite(load.request_rate) ? nlohmann::json(load.request_rate)
                                                          : nlohmann::json("inf")},
        {"burstiness", load.burstiness},
        {"max_concurrency", load.max_concurrency},
        {"duration_s", load.duration_seconds},
        {"grace_s", load.grace_seconds},
        {"warmup_requests", warmup_requests},
        {"temperature", options.temperature},
        {"ignore_eos", options.ignore_eos},
        {"seed", load.seed},
        {"goodput_slos_ms", slos->limits_ms},
    };
    if (backend == "http") {
      config["endpoint"] = options.endpoint;
      config["model"] = options.model;
    }
    nlohmann::json result = {
        {"label", flags.label},
        {"command", command},
        {"config", config},
        {"num_issued", summary.num_issued},
        {"completed", summary.num_completed},
        {"failed", summary.num_failed},
        {"cancelled_at_bound", run.num_cancelled_at_bound},
        {"errors", summary.errors},
        {"duration_s", summary.duration_seconds},
        {"total_input_tokens", summary.total_input_tokens},
        {"total_output_tokens", summary.total_output_tokens},
        {"token_counting", TokenCountingName(counting)},
        {"request_throughput", summary.request_throughput},
        {"output_throughput", summary.output_throughput},
        {"total_token_throughput", summary.total_token_throughput},
        {"goodput", slos->empty() ? nlohmann::json(nullptr) : nlohmann::json(summary.goodput)},
        {"num_good", summary.num_good},
        {"ttft_ms", DistributionJson(summary.ttft_ms)},
        {"tpot_ms", DistributionJson(summary.tpot_ms)},
        {"itl_ms", DistributionJson(summary.itl_ms)},
        {"e2el_ms", DistributionJson(summary.e2el_ms)},
    };
    if (!metrics_url.empty()) {
      nlohmann::json server = {{"metrics_url", metrics_url},
                               {"histogram", kTtftHistogram},
                               {"client_ttft_mean_ms", summary.ttft_ms.mean}};
      if (server_ttft.measured) {
        server["server_ttft_mean_ms"] = server_ttft.mean_seconds * 1e3;
        server["server_ttft_count"] = server_ttft.count;
        server["relative_difference"] = relative_difference;
        server["prefix_cache_queries"] = deltas.prefix_cache_queries;
        server["prefix_cache_hits"] = deltas.prefix_cache_hits;
        server["engine_steps"] = deltas.steps;
        for (size_t i = 0; i < kStepPhases.size(); ++i) {
          server[StrCat("step_", kStepPhases[i], "_s")] = deltas.step_phase_seconds[i];
        }
      } else {
        server["error"] = server_ttft.error;
      }
      result["server_ttft"] = server;
    }
    std::ofstream out(*flags.result_json);
    out << result.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "lmserve-bench serve: cannot write %s\n", flags.result_json->c_str());
      return 1;
    }
  }
  return summary.num_completed > 0 ? 0 : 1;
}

}  // namespace

std::function<int()> DeclareServe(CLI::App* command, std::string command_line) {
  command->footer(
      "Measures a serving system under load, as vLLM's benchmark_serving does: TTFT, inter-token "
      "latency, time per output token, end-to-end latency (mean, percentiles), throughput and "
      "goodput. Prints a summary; --result-json writes it as JSON.");
  auto flags = std::make_shared<ServeFlags>();
  BindServeFlags(command, flags.get());
  return [flags, command_line = std::move(command_line)] { return RunServe(*flags, command_line); };
}

}  // namespace lmserve::bench
