#include "app/commands.h"

namespace moeserve::app {

// Not implemented yet: registers nothing (see the open issues).
void register_model_commands(CLI::App& /*app*/) {}

}  // namespace moeserve::app
