// The built-in strategies, in the order the CLI lists them. Adding one: a new
// file defining make_<name>_strategy(), and its name in this list.
#include "parallel/strategy.h"

#define TESSERA_STRATEGIES(X) X(single) X(tp) X(sp) X(voltage) X(pipeline) X(galaxy) X(prism) X(bp)

namespace tessera::parallel {

#define TESSERA_DECLARE(name) std::unique_ptr<Strategy> make_##name##_strategy();
TESSERA_STRATEGIES(TESSERA_DECLARE)
#undef TESSERA_DECLARE

std::vector<std::unique_ptr<Strategy>> builtin_strategies() {
  std::vector<std::unique_ptr<Strategy>> list;
#define TESSERA_ADD(name) list.push_back(make_##name##_strategy());
  TESSERA_STRATEGIES(TESSERA_ADD)
#undef TESSERA_ADD
  return list;
}

}  // namespace tessera::parallel
