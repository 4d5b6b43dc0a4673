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
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "bench/lmserve_bench/client.h"
#include "bench/lmserve_bench/dataset.h"
#include "bench/lmserve_bench/prometheus_text.h"
#include "bench/lmserve_bench/stats.h"
#include "common/hash.h"
#include "common/strings.h"
#include "server/args.h"

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
};

absl::StatusOr<ServerDeltas> Scrape(const std::string& url) {
  absl::StatusOr<std::string> text = HttpGet(url, 10);
  if (!text.ok()) return text.status();
  ServerDeltas values;
  values.ttft = ReadHistogram(*text, kTtftHistogram);
  values.prefix_cache_queries = SumSamples(*text, "lmserve_prefix_cache_queries_total");
  values.prefix_cache_hits = SumSamples(*text, "lmserve_prefix_cache_hits_total");
  return values;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "lmserve-bench serve: %s\n", message.c_str());
  return 2;
}

}  // namespace

int RunServe(int argc, char** argv) {
  // Once, before any thread starts; never cleaned up (the process ends with the benchmark).
  curl_global_init(CURL_GLOBAL_DEFAULT);
  server::Args args("serve",
                    "Measures a serving system under load, as vLLM's benchmark_serving does: TTFT, "
                    "inter-token latency, time per output token, end-to-end latency "
                    "(mean, percentiles), throughput and goodput. Prints a summary; --result-json "
                    "writes it as JSON.");
  args.Program("lmserve-bench")
      .Option("backend", "grpc (lmserve's API) or http (an OpenAI-compatible /v1/completions)",
              "grpc")
      .Option("addr", "grpc: the server, HOST:PORT", "127.0.0.1:50051")
      .Option("url", "http: the base URL", "http://127.0.0.1:8000")
      .Option("endpoint", "http: the completions path", "/v1/completions")
      .Option("model", "http: the model name to send", "default")
      .Option("token-file", "send 'authorization: Bearer <token>', the token read from this file")
      .Option("channels", "grpc: connections to spread requests over", "4")
      .Option("dataset",
              "a JSONL file: {\"prompt\": TEXT | \"prompt_token_ids\": [...], "
              "\"output_len\": N} per line (default: synthetic token-id prompts)")
      .Option("input-len", "synthetic: prompt tokens", "128")
      .Option("output-len", "synthetic: output tokens (and the default for dataset lines)", "128")
      .Option("range-ratio", "synthetic: lengths uniform in len*(1-r)..len*(1+r)", "0")
      .Option("vocab-size", "synthetic: draw ids below this (default: grpc asks the server)")
      .Option("first-token-id", "synthetic: draw ids from this one up (skips special tokens)",
              "100")
      .Option("num-prompts", "requests to issue (default: 100, or unbounded with --duration-s)")
      .Option("concurrency", "a closed loop: N requests in flight (rate inf)")
      .Option("request-rate", "requests per second (Poisson arrivals); inf: all at once", "inf")
      .Option("burstiness", "gamma shape of the arrival gaps: 1 Poisson, < 1 burstier", "1")
      .Option("max-concurrency", "with --request-rate: at most N in flight; 0: no limit", "0")
      .Option("duration-s", "stop issuing after this many seconds; 0: no bound", "0")
      .Option("grace-s", "with --duration-s: wait this long for requests in flight", "30")
      .Option("warmup-requests",
              "requests run first and not counted (default: the concurrency, "
              "else 4)")
      .Option("request-timeout-s", "each request's deadline; 0: none", "0")
      .Option("temperature", "sampling temperature (0: greedy)", "0")
      .Flag("no-ignore-eos", "let the model stop at EOS (outputs may be shorter than asked)")
      .Option("goodput", "SLOs in ms for goodput, e.g. 'ttft:500 tpot:50' (ttft, tpot, e2el)")
      .Option("percentiles", "the percentiles to report", "50,90,99")
      .Option("metrics-url",
              "the server's Prometheus /metrics, scraped before and after the run: "
              "the server's TTFT mean is compared with the client's")
      .Option("wait-ready-s", "first wait up to this long for the server to be ready", "0")
      .Option("seed", "seeds the synthetic prompts and the arrivals", "0")
      .Option("result-json", "write the results to this JSON file")
      .Option("label", "a label recorded in the JSON (e.g. the sweep point)");
  absl::StatusOr<bool> parsed = args.Parse(argc, argv);
  if (!parsed.ok()) return Usage(std::string(parsed.status().message()));
  if (!*parsed) return 0;

  auto get_int = [&](const char* name) -> int64_t {
    absl::StatusOr<int64_t> value = args.GetInt(name);
    if (!value.ok()) {
      std::fprintf(stderr, "lmserve-bench serve: --%s: want an integer\n", name);
      std::exit(2);
    }
    return *value;
  };
  auto get_double = [&](const char* name) -> double {
    const std::string text = args.Get(name);
    if (text == "inf") return std::numeric_limits<double>::infinity();
    absl::StatusOr<double> value = args.GetDouble(name);
    if (!value.ok()) {
      std::fprintf(stderr, "lmserve-bench serve: --%s: want a number\n", name);
      std::exit(2);
    }
    return *value;
  };

  ClientOptions options;
  const std::string backend = args.Get("backend");
  if (backend == "grpc") {
    options.target = args.Get("addr");
  } else if (backend == "http") {
    options.target = args.Get("url");
    options.endpoint = args.Get("endpoint");
    options.model = args.Get("model");
  } else {
    return Usage("--backend: grpc or http");
  }
  if (args.Has("token-file")) {
    std::ifstream file(args.Get("token-file"));
    if (!file) return Usage(StrCat("cannot read ", args.Get("token-file")));
    std::getline(file, options.token);
    while (!options.token.empty() &&
           (options.token.back() == '\r' || options.token.back() == ' ')) {
      options.token.pop_back();
    }
  }
  options.num_channels = static_cast<int32_t>(get_int("channels"));
  options.temperature = get_double("temperature");
  options.ignore_eos = !args.GetFlag("no-ignore-eos");
  options.request_timeout_seconds = get_double("request-timeout-s");

  LoadSpec load;
  load.seed = static_cast<uint64_t>(get_int("seed"));
  load.duration_seconds = get_double("duration-s");
  load.grace_seconds = get_double("grace-s");
  if (args.Has("concurrency")) {
    if (args.Has("max-concurrency") && args.Get("max-concurrency") != "0") {
      return Usage("give --concurrency or --max-concurrency, not both");
    }
    load.max_concurrency = get_int("concurrency");
    if (load.max_concurrency < 1) return Usage("--concurrency: want >= 1");
    if (args.Get("request-rate") != "inf") {
      return Usage(
          "--concurrency is a closed loop: leave --request-rate at inf, or use "
          "--max-concurrency");
    }
  } else {
    load.max_concurrency = get_int("max-concurrency");
  }
  load.request_rate = get_double("request-rate");
  load.burstiness = get_double("burstiness");
  if (!(load.request_rate > 0) || !(load.burstiness > 0)) {
    return Usage("--request-rate and --burstiness must be > 0");
  }
  if (args.Has("num-prompts")) {
    load.num_requests = get_int("num-prompts");
    if (load.num_requests < 1) return Usage("--num-prompts: want >= 1");
  } else {
    load.num_requests = load.duration_seconds > 0 ? std::numeric_limits<int64_t>::max() : 100;
  }
  absl::StatusOr<Slos> slos = ParseSlos(args.Get("goodput"));
  if (!slos.ok()) return Usage(std::string(slos.status().message()));
  std::vector<int> percentiles;
  for (std::string_view piece : StrSplit(args.Get("percentiles"), ',')) {
    std::optional<int> p = ParseInt<int>(piece);
    if (!p || *p < 0 || *p > 100) return Usage("--percentiles: want integers in [0, 100]");
    percentiles.push_back(*p);
  }
  const int64_t warmup_requests = args.Has("warmup-requests")
                                      ? get_int("warmup-requests")
                                      : (load.max_concurrency > 0 ? load.max_concurrency : 4);

  absl::StatusOr<std::unique_ptr<Client>> client =
      backend == "grpc" ? CreateGrpcClient(options) : CreateHttpClient(options);
  if (!client.ok()) return Usage(std::string(client.status().message()));
  if (const double wait = get_double("wait-ready-s"); wait > 0) {
    if (absl::Status ready = (*client)->WaitReady(wait); !ready.ok()) {
      std::fprintf(stderr, "lmserve-bench serve: %s\n", std::string(ready.message()).c_str());
      return 1;
    }
  }

  // Prompts: the measured ones and, separately, the warm-up's (so that warm-up does not fill the
  // prefix cache with the measured prompts).
  const int32_t output_len = static_cast<int32_t>(get_int("output-len"));
  std::vector<Prompt> prompts, warmup_prompts;
  std::string dataset_name;
  if (args.Has("dataset")) {
    absl::StatusOr<std::vector<Prompt>> read = ReadJsonlDataset(args.Get("dataset"), output_len);
    if (!read.ok()) return Usage(std::string(read.status().message()));
    prompts = std::move(*read);
    // Warm-up takes the dataset's last prompts, the measured run its first: they share no prompt
    // (and so no prefix-cache entry) when the dataset is long enough. The JSON reports the
    // server's prefix-cache hits either way.
    warmup_prompts.assign(prompts.rbegin(), prompts.rend());
    dataset_name = args.Get("dataset");
  } else {
    SyntheticSpec spec;
    spec.input_len = static_cast<int32_t>(get_int("input-len"));
    spec.output_len = output_len;
    spec.range_ratio = get_double("range-ratio");
    spec.first_id = static_cast<int32_t>(get_int("first-token-id"));
    spec.seed = load.seed;
    if (args.Has("vocab-size")) {
      spec.vocab_size = static_cast<int32_t>(get_int("vocab-size"));
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

  const std::string metrics_url = args.Get("metrics-url");
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
                         : StrCat("rate ", args.Get("request-rate"), " req/s, burstiness ",
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
  }
  std::printf("==================================================\n");
  std::fflush(stdout);

  if (args.Has("result-json")) {
    std::string command = "lmserve-bench serve";
    for (int i = 0; i < argc; ++i) command += StrCat(" ", argv[i]);
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
        {"label", args.Get("label")},
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
      } else {
        server["error"] = server_ttft.error;
      }
      result["server_ttft"] = server;
    }
    std::ofstream out(args.Get("result-json"));
    out << result.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "lmserve-bench serve: cannot write %s\n",
                   args.Get("result-json").c_str());
      return 1;
    }
  }
  return summary.num_completed > 0 ? 0 : 1;
}

}  // namespace lmserve::bench
