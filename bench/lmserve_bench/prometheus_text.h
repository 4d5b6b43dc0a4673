// Reads the figures the benchmark compares with from Prometheus' text exposition format.

#ifndef LMSERVE_BENCH_LMSERVE_BENCH_PROMETHEUS_TEXT_H_
#define LMSERVE_BENCH_LMSERVE_BENCH_PROMETHEUS_TEXT_H_

#include <string>
#include <string_view>

namespace lmserve::bench {

// The sum over every label set of the samples named exactly `name` (e.g.
// "lmserve_time_to_first_token_seconds_sum"); 0 when there are none. With `label` (e.g.
// `phase="process"`), only the samples that carry that label and value.
double SumSamples(std::string_view exposition, std::string_view name, std::string_view label = {});

// A histogram's _sum and _count, summed over label sets.
struct HistogramTotals {
  double sum = 0;
  double count = 0;
};
HistogramTotals ReadHistogram(std::string_view exposition, std::string_view histogram_name);

}  // namespace lmserve::bench

#endif  // LMSERVE_BENCH_LMSERVE_BENCH_PROMETHEUS_TEXT_H_
