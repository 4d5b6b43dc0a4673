#include "bench/lmserve_bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/strings.h"

namespace lmserve::bench {

void AddChunk(RequestRecord* record, double time, int32_t num_tokens) {
  if (num_tokens <= 0) return;
  if (record->first_token_time < 0) {
    // The first chunk sets TTFT; its other tokens (if any) have no gap of their own.
    record->first_token_time = time;
  } else {
    const double gap = (time - record->end_time) / num_tokens;
    for (int32_t i = 0; i < num_tokens; ++i) record->itl_seconds.push_back(gap);
  }
  record->output_tokens += num_tokens;
  record->end_time = time;  // the latest chunk; the transport sets the true end at the stream's end
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lower = static_cast<size_t>(std::floor(rank));
  const size_t upper = std::min(lower + 1, values.size() - 1);
  const double fraction = rank - static_cast<double>(lower);
  return values[lower] + (values[upper] - values[lower]) * fraction;
}

Distribution Summarize(const std::vector<double>& values, const std::vector<int>& percentiles) {
  Distribution d;
  d.count = static_cast<int64_t>(values.size());
  if (values.empty()) {
    for (int p : percentiles) d.percentiles[p] = 0;
    return d;
  }
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  double squares = 0;
  for (double v : values) squares += (v - d.mean) * (v - d.mean);
  d.stddev = std::sqrt(squares / static_cast<double>(values.size()));  // population, as numpy
  d.min = *std::min_element(values.begin(), values.end());
  d.max = *std::max_element(values.begin(), values.end());
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  for (int p : percentiles) d.percentiles[p] = Percentile(sorted, p);
  return d;
}

absl::StatusOr<Slos> ParseSlos(const std::string& text) {
  Slos slos;
  std::string normalized = text;
  std::replace(normalized.begin(), normalized.end(), ',', ' ');
  for (std::string_view piece : StrSplit(normalized, ' ')) {
    if (piece.empty()) continue;
    const std::string item(piece);
    const size_t colon = item.find(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(StrCat("--goodput: want KEY:MS, got '", item, "'"));
    }
    const std::string key = item.substr(0, colon);
    if (key != "ttft" && key != "tpot" && key != "e2el") {
      return absl::InvalidArgumentError(
          StrCat("--goodput: unknown metric '", key, "' (ttft, tpot or e2el)"));
    }
    char* end = nullptr;
    const std::string value_text = item.substr(colon + 1);
    const double value = std::strtod(value_text.c_str(), &end);
    if (value_text.empty() || *end != '\0' || !(value > 0)) {
      return absl::InvalidArgumentError(
          StrCat("--goodput: want a positive number of milliseconds for ", key));
    }
    slos.limits_ms[key] = value;
  }
  return slos;
}

bool MeetsSlos(const RequestRecord& record, const Slos& slos) {
  if (!record.success) return false;
  for (const auto& [key, limit_ms] : slos.limits_ms) {
    double value_ms = 0;
    if (key == "ttft") {
      value_ms = record.ttft_seconds() * 1e3;
    } else if (key == "tpot") {
      value_ms = record.output_tokens > 1 ? record.tpot_seconds() * 1e3 : 0;
    } else {
      value_ms = record.e2el_seconds() * 1e3;
    }
    if (value_ms > limit_ms) return false;
  }
  return true;
}

BenchmarkSummary Summarize(const std::vector<RequestRecord>& records, double duration_seconds,
                           const Slos& slos, const std::vector<int>& percentiles) {
  BenchmarkSummary s;
  s.duration_seconds = duration_seconds;
  s.num_issued = static_cast<int64_t>(records.size());
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestRecord& r : records) {
    if (!r.success) {
      ++s.num_failed;
      ++s.errors[r.error.empty() ? "unknown error" : r.error];
      continue;
    }
    ++s.num_completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.output_tokens;
    if (MeetsSlos(r, slos)) ++s.num_good;
    if (r.first_token_time >= 0) ttft.push_back(r.ttft_seconds() * 1e3);
    if (r.output_tokens > 1) tpot.push_back(r.tpot_seconds() * 1e3);
    for (double gap : r.itl_seconds) itl.push_back(gap * 1e3);
    e2el.push_back(r.e2el_seconds() * 1e3);
  }
  if (duration_seconds > 0) {
    s.request_throughput = static_cast<double>(s.num_completed) / duration_seconds;
    s.output_throughput = static_cast<double>(s.total_output_tokens) / duration_seconds;
    s.total_token_throughput =
        static_cast<double>(s.total_input_tokens + s.total_output_tokens) / duration_seconds;
    s.goodput = static_cast<double>(s.num_good) / duration_seconds;
  }
  s.ttft_ms = Summarize(ttft, percentiles);
  s.tpot_ms = Summarize(tpot, percentiles);
  s.itl_ms = Summarize(itl, percentiles);
  s.e2el_ms = Summarize(e2el, percentiles);
  return s;
}

}  // namespace lmserve::bench
