#include "bench/lmserve_bench/prometheus_text.h"

#include <cstdlib>
#include <string>

#include "common/strings.h"

namespace lmserve::bench {

double SumSamples(std::string_view exposition, std::string_view name, std::string_view label) {
  double total = 0;
  for (std::string_view line : StrSplit(exposition, '\n')) {
    if (line.empty() || line.front() == '#') continue;
    if (line.substr(0, name.size()) != name) continue;
    std::string_view rest = line.substr(name.size());
    if (rest.empty()) continue;
    bool labelled = label.empty();
    if (rest.front() == '{') {  // labels: values are quoted and may hold '}', so skip quoted text
      size_t i = 1;
      bool quoted = false;
      for (; i < rest.size(); ++i) {
        if (quoted && rest[i] == '\\') {
          ++i;
        } else if (rest[i] == '"') {
          quoted = !quoted;
        } else if (!quoted && rest[i] == '}') {
          break;
        }
      }
      if (i >= rest.size()) continue;
      if (!labelled) {  // `label` as a whole label: after '{' or ',', before ',' or '}'
        const std::string_view labels = rest.substr(1, i - 1);
        for (size_t at = labels.find(label); at != std::string_view::npos && !labelled;
             at = labels.find(label, at + 1)) {
          const size_t end = at + label.size();
          labelled =
              (at == 0 || labels[at - 1] == ',') && (end == labels.size() || labels[end] == ',');
        }
      }
      rest = rest.substr(i + 1);
    }
    if (!labelled) continue;
    if (rest.empty() || rest.front() != ' ') continue;  // a longer name with this prefix
    const std::string value(rest.substr(1));
    total += std::strtod(value.c_str(), nullptr);  // a timestamp after the value is ignored
  }
  return total;
}

HistogramTotals ReadHistogram(std::string_view exposition, std::string_view histogram_name) {
  return {SumSamples(exposition, StrCat(histogram_name, "_sum")),
          SumSamples(exposition, StrCat(histogram_name, "_count"))};
}

}  // namespace lmserve::bench
