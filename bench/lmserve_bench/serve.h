// `lmserve-bench serve`: the serving benchmark (load generator and report). See serve.cc.

#ifndef LMSERVE_BENCH_LMSERVE_BENCH_SERVE_H_
#define LMSERVE_BENCH_LMSERVE_BENCH_SERVE_H_

namespace lmserve::bench {

// argv[0] is the subcommand's first argument. Returns the exit code: 0 success, 1 the run failed
// (server unreachable, every request failed), 2 bad usage.
int RunServe(int argc, char** argv);

}  // namespace lmserve::bench

#endif  // LMSERVE_BENCH_LMSERVE_BENCH_SERVE_H_
