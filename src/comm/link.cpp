#include "comm/link.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/io.h"

namespace tessera::comm {

namespace {

std::string lower(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (!std::isspace(static_cast<unsigned char>(c))) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// Splits "100mbit" into 100 and "mbit".
bool split_number(const std::string& s, double* value, std::string* unit) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return false;
  const auto res = std::from_chars(s.data(), s.data() + i, *value);
  if (res.ec != std::errc() || res.ptr != s.data() + i || !std::isfinite(*value) || *value < 0) return false;
  *unit = s.substr(i);
  return true;
}

}  // namespace

namespace {

// Bounds that keep every later conversion finite: a link's release times as
// durations, its burst as a byte count (a job's "1e308mb" or "1e300s").
core::Status check_link(const LinkSpec& l) {
  if (!(l.latency_s >= 0 && l.latency_s <= 86400)) return core::invalid_argument("link latency must be in [0, 1 day]");
  if (!(l.bandwidth_bps == 0 || (l.bandwidth_bps >= 1e3 && l.bandwidth_bps <= 1e13)))
    return core::invalid_argument("link bandwidth must be in [1 kbit, 10000 gbit] per second");
  if (!(l.burst_bytes >= 0 && l.burst_bytes <= 1024.0 * 1024 * 1024)) return core::invalid_argument("link burst must be in [0, 1 GiB]");
  return core::ok_status();
}

}  // namespace

core::Result<LinkSpec> parse_link_spec(std::string_view text) {
  const std::string s = lower(text);
  if (s.empty()) return core::invalid_argument("empty link spec");
  LinkSpec spec;
  bool have_bw = false, have_lat = false, have_burst = false;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    const std::string part = s.substr(start, comma - start);
    start = comma + 1;
    double v = 0;
    std::string unit;
    if (!split_number(part, &v, &unit)) {
      return core::invalid_argument("link spec '" + std::string(text) + "': cannot read '" + part + "'");
    }
    double bw_scale = 0, lat_scale = 0, burst_scale = 0;
    if (unit == "bit" || unit == "bps") bw_scale = 1;
    else if (unit == "kbit") bw_scale = 1e3;
    else if (unit == "mbit") bw_scale = 1e6;
    else if (unit == "gbit") bw_scale = 1e9;
    else if (unit == "s") lat_scale = 1;
    else if (unit == "ms") lat_scale = 1e-3;
    else if (unit == "us") lat_scale = 1e-6;
    else if (unit == "b") burst_scale = 1;
    else if (unit == "kb") burst_scale = 1024;
    else if (unit == "mb") burst_scale = 1024.0 * 1024;
    else return core::invalid_argument("link spec: unknown unit '" + unit + "' (bit, kbit, mbit, gbit, s, ms, us, b, kb, mb)");
    if (burst_scale > 0) {
      if (have_burst) return core::invalid_argument("link spec: burst given twice");
      have_burst = true;
      spec.burst_bytes = v * burst_scale;
    } else if (bw_scale > 0) {
      if (have_bw) return core::invalid_argument("link spec: bandwidth given twice");
      have_bw = true;
      spec.bandwidth_bps = v * bw_scale;
    } else {
      if (have_lat) return core::invalid_argument("link spec: latency given twice");
      have_lat = true;
      spec.latency_s = v * lat_scale;
    }
    if (comma == s.size()) break;
  }
  // "100mb" is more likely a bandwidth with a typo than a burst on its own.
  if (have_burst && !have_bw)
    return core::invalid_argument("link spec '" + std::string(text) + "': a burst (b, kb, mb: bytes) needs a bandwidth (bit, kbit, mbit, gbit)");
  TESSERA_RETURN_IF_ERROR(check_link(spec));
  return spec;
}

LinkMatrix LinkMatrix::uniform(int world, LinkSpec spec) {
  LinkMatrix m;
  m.world_ = world;
  m.links_.assign(static_cast<size_t>(world) * world, spec);
  return m;
}

core::Result<LinkMatrix> LinkMatrix::from_json(const std::string& json_text, int world) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return core::parse_error("link matrix: not a JSON object");
  LinkMatrix m = uniform(world, LinkSpec{});
  auto read = [&](const char* key, double scale, double LinkSpec::*field) -> core::Status {
    if (!j.contains(key)) return core::ok_status();
    const auto& rows = j[key];
    if (!rows.is_array() || static_cast<int>(rows.size()) != world) {
      return core::parse_error(std::string("link matrix: '") + key + "' must be " + std::to_string(world) + " rows");
    }
    for (int i = 0; i < world; ++i) {
      const auto& row = rows[i];
      if (!row.is_array() || static_cast<int>(row.size()) != world) {
        return core::parse_error(std::string("link matrix: '") + key + "' row " + std::to_string(i) + " must have " +
                                 std::to_string(world) + " entries");
      }
      for (int k = 0; k < world; ++k) {
        if (!row[k].is_number() || row[k].get<double>() < 0 || !std::isfinite(row[k].get<double>())) {
          return core::parse_error(std::string("link matrix: '") + key + "' has a bad entry");
        }
        LinkSpec& l = m.links_[static_cast<size_t>(i) * world + k];
        l.*field = row[k].get<double>() * scale;
        if (const core::Status st = check_link(l); !st.ok())
          return core::parse_error("link matrix: '" + std::string(key) + "': " + st.message());
      }
    }
    return core::ok_status();
  };
  TESSERA_RETURN_IF_ERROR(read("bandwidth_bps", 1.0, &LinkSpec::bandwidth_bps));
  TESSERA_RETURN_IF_ERROR(read("latency_ms", 1e-3, &LinkSpec::latency_s));
  TESSERA_RETURN_IF_ERROR(read("burst_bytes", 1.0, &LinkSpec::burst_bytes));
  return m;
}

core::Result<LinkMatrix> LinkMatrix::load(const std::string& path, int world) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, core::read_file(path));
  auto m = from_json(text, world);
  if (!m.ok()) return m.status().with_context(path);
  return m;
}

core::Result<LinkMatrix> LinkMatrix::from_arg(const std::string& arg, int world) {
  if (!arg.empty() && arg[0] == '@') return load(arg.substr(1), world);
  if (arg.size() > 5 && arg.substr(arg.size() - 5) == ".json") return load(arg, world);
  TESSERA_ASSIGN_OR_RETURN(LinkSpec spec, parse_link_spec(arg));
  return uniform(world, spec);
}

LinkSpec LinkMatrix::link(int from, int to) const {
  if (empty() || from < 0 || to < 0 || from >= world_ || to >= world_ || from == to) return {};
  return links_[static_cast<size_t>(from) * world_ + to];
}

LinkPacer::Clock::time_point LinkPacer::schedule(size_t bytes, Clock::time_point now) {
  Clock::time_point release = now;
  if (spec_.bandwidth_bps > 0) {
    const auto to_duration = [&](double bits) {
      return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(bits / spec_.bandwidth_bps));
    };
    // An idle link lends at most `burst` worth of credit.
    free_at_ = std::max(free_at_, now - to_duration(8.0 * static_cast<double>(burst_bytes_)));
    free_at_ += to_duration(8.0 * static_cast<double>(bytes));
    release = std::max(now, free_at_);
  }
  release += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(spec_.latency_s));
  release = std::max(release, last_release_);
  last_release_ = release;
  return release;
}

}  // namespace tessera::comm
