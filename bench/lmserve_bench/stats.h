// The serving benchmark's statistics: per-request measurements, their percentiles and goodput,
// defined as vLLM's benchmark_serving defines them so that figures can be compared:
//
//   TTFT  time to first token: from sending the request to receiving the first streamed token.
//   ITL   inter-token latency: the gaps between streamed chunks after the first. A chunk that
//   carries
//         k > 1 tokens after a gap g counts as k gaps of g / k, so that the ITL values of a request
//         sum to its decode time (vLLM counts one gap per chunk; our gRPC stream may batch tokens).
//   TPOT  time per output token: (e2e - ttft) / (output_tokens - 1), for requests with > 1 token.
//   E2EL  end-to-end latency: from sending to the stream's end.
//   goodput  requests per second that met every given SLO (ttft, tpot, e2el, in milliseconds).
//
// Percentiles interpolate linearly between order statistics (numpy's default, as vLLM uses).

#ifndef LMSERVE_BENCH_LMSERVE_BENCH_STATS_H_
#define LMSERVE_BENCH_LMSERVE_BENCH_STATS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lmserve::bench {

// What the client saw of one request. Times are seconds on the client's steady clock.
struct RequestRecord {
  bool success = false;
  std::string error;          // why it failed, when !success
  int32_t prompt_tokens = 0;  // as sent (or as the server reported, when it did)
  int32_t expected_output_tokens = 0;
  int32_t output_tokens = 0;        // tokens received
  double send_time = 0;             // when the request was handed to the transport
  double first_token_time = -1;     // when the first token arrived; < 0: none arrived
  double end_time = 0;              // when the stream ended
  std::vector<double> itl_seconds;  // see the file comment

  double ttft_seconds() const { return first_token_time - send_time; }
  double e2el_seconds() const { return end_time - send_time; }
  // Only meaningful when output_tokens > 1.
  double tpot_seconds() const {
    return (e2el_seconds() - ttft_seconds()) / static_cast<double>(output_tokens - 1);
  }
};

// A chunk of streamed tokens as a transport received it.
// REQUIRES: chunks arrive in time order. Adds `num_tokens` tokens at `time` to `record`.
void AddChunk(RequestRecord* record, double time, int32_t num_tokens);

// Summary statistics of one metric, in milliseconds (or the unit of the input).
struct Distribution {
  int64_t count = 0;
  double mean = 0;
  double stddev = 0;
  double min = 0;
  double max = 0;
  std::map<int, double> percentiles;  // percentile -> value
};

// The p-th percentile (0 <= p <= 100) of `values` by linear interpolation; 0 when empty.
double Percentile(std::vector<double> values, double p);

// REQUIRES: every requested percentile is in [0, 100].
Distribution Summarize(const std::vector<double>& values, const std::vector<int>& percentiles);

// Service level objectives in milliseconds; a metric absent is not constrained.
struct Slos {
  std::map<std::string, double> limits_ms;  // keys: "ttft", "tpot", "e2el"
  bool empty() const { return limits_ms.empty(); }
};

// Parses "ttft:500 tpot:50" (space- or comma-separated KEY:MS pairs).
absl::StatusOr<Slos> ParseSlos(const std::string& text);

// Whether a successful request met every SLO. A request with one output token has no TPOT and
// meets any TPOT SLO (vLLM's convention: its TPOT is 0).
bool MeetsSlos(const RequestRecord& record, const Slos& slos);

// The benchmark's figures over the measured requests.
struct BenchmarkSummary {
  int64_t num_issued = 0;
  int64_t num_completed = 0;  // succeeded
  int64_t num_failed = 0;  // errors (transport, HTTP or gRPC status), in-flight at the end included
  int64_t num_good = 0;    // completed and met the SLOs (all completed when there are none)
  double duration_seconds = 0;
  int64_t total_input_tokens = 0;     // of completed requests
  int64_t total_output_tokens = 0;    // of completed requests
  double request_throughput = 0;      // completed / duration
  double output_throughput = 0;       // output tokens / duration
  double total_token_throughput = 0;  // (input + output tokens) / duration
  double goodput = 0;                 // good / duration; equals request_throughput without SLOs
  Distribution ttft_ms, tpot_ms, itl_ms, e2el_ms;
  std::map<std::string, int64_t> errors;  // error text -> count
};

BenchmarkSummary Summarize(const std::vector<RequestRecord>& records, double duration_seconds,
                           const Slos& slos, const std::vector<int>& percentiles);

}  // namespace lmserve::bench

#endif  // LMSERVE_BENCH_LMSERVE_BENCH_STATS_H_
