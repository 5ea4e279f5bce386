#include "app/commands.h"

namespace moeserve::app {

// Not implemented yet: registers nothing (see the open issues).
void register_bench_forward(CLI::App& /*bench*/) {}

}  // namespace moeserve::app
