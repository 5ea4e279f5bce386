#include "app/commands.h"

namespace moeserve::app {

// Not implemented yet: registers nothing (see the open issues).
void register_generate_command(CLI::App& /*app*/) {}

}  // namespace moeserve::app
