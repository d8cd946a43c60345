// Always-on invariant checks (never compiled out, unlike assert()).
#pragma once

#include <sstream>
#include <string>

#include "core/status.h"

#define TESSERA_CHECK(cond)                                                        \
  do {                                                                             \
    if (!(cond)) ::tessera::core::check_failed(__FILE__, __LINE__, #cond, "");     \
  } while (0)

#define TESSERA_CHECK_MSG(cond, msg)                                               \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::ostringstream tessera_os_;                                              \
      tessera_os_ << msg;                                                          \
      ::tessera::core::check_failed(__FILE__, __LINE__, #cond, tessera_os_.str()); \
    }                                                                              \
  } while (0)
