#include "harness/search/flag_trial.h"
#include "harness/search/launcher.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "harness/check/compare.h"
#include "harness/core/error.h"
#include "harness/capture/store.h"
#include "harness/search/trial.h"

extern char** environ;

namespace dc {

std::string join_flags(const FlagSet& flags) { return fmt::format("{}", fmt::join(flags, " ")); }

FlagSet split_list(const std::string& s) {
  FlagSet out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ','))
    if (!part.empty()) out.push_back(part);
  return out;
}

void FlagTarget::validate() const {
  if (external() == !scenario.empty())
    input_error("give either --scenario NAME or a command after --, not both or neither");
  if (external() && env_var.empty() &&
      std::none_of(command.begin(), command.end(),
                   [](const std::string& a) { return a.find("{flags}") != std::string::npos; }))
    input_error("the command must receive the flags: use --env VAR (e.g. XLA_FLAGS) or a {{flags}} "
                "placeholder in the command");
  if (timeout_seconds <= 0) input_error("--timeout must be positive");
}

std::string FlagTarget::identity() const {
  if (external())
    return fmt::format("cmd={} env={} check={} timeout={}", fmt::join(command, "\x1f"), env_var,
                       check_file, timeout_seconds);
  return fmt::format("scenario={} n={} fault={} dtype={} size={} timeout={}{}{}", scenario, ranks, fault,
                     dtype, size, timeout_seconds, launcher.empty() ? "" : " launcher=" + launcher,
                     pipeline.identity());
}

namespace {

std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  auto p = t.find_last_of('\n');
  return p == std::string::npos ? t : t.substr(p + 1);
}

FlagTrialResult from_outcome(const TrialOutcome& t) {
  FlagTrialResult r;
  r.seconds = t.seconds;
  r.detail = t.describe();
  switch (t.classify()) {
    case TrialOutcome::Class::pass: r.verdict = Verdict::pass; break;
    case TrialOutcome::Class::fail: r.verdict = Verdict::fail; break;
    case TrialOutcome::Class::crashed:
      r.verdict = Verdict::crashed;
      if (t.kind == TrialOutcome::Kind::exited && t.exit_code < 128)  // known from mpirun's words
        r.detail = fmt::format("{}, a process killed by signal {} ({})", t.describe(), t.crash_signal(),
                               strsignal(t.crash_signal()));
      break;
    case TrialOutcome::Class::timed_out: r.verdict = Verdict::timed_out; break;
    case TrialOutcome::Class::interrupted: r.verdict = Verdict::interrupted; break;
    case TrialOutcome::Class::error:
      r.verdict = Verdict::error;
      r.detail = fmt::format("{}: {}", t.describe(), last_line(t.output));
      break;
  }
  return r;
}

FlagTrialResult run_scenario_trial(const FlagTarget& t, const FlagSet& flags, const std::string& dir) {
  const std::string out = dir + "/run.h5", json = dir + "/report.json";
  std::filesystem::remove(json);
  TrialSpec spec{launcher_argv(t.launcher, t.mpirun, t.ranks), {}, t.timeout_seconds};
  spec.argv.insert(spec.argv.end(), {self_executable(), "--scenario", t.scenario, "--dtype", t.dtype,
                                     "--size", t.size, "--out", out, "--json", json});
  if (!t.fault.empty()) spec.argv.insert(spec.argv.end(), {"--inject", t.fault});
  for (const auto& a : t.pipeline.args()) spec.argv.push_back(a);
  for (const auto& f : flags) spec.argv.insert(spec.argv.end(), {"--flag", f});
  TrialOutcome o = run_trial(spec);
  FlagTrialResult r = from_outcome(o);
  // diffcheck's own exit 2 is an error of the trial (bad flag, bad input),
  // not a wrong answer.
  if (o.kind == TrialOutcome::Kind::exited && o.exit_code == 2) {
    r.verdict = Verdict::error;
    r.detail = last_line(o.output);
  } else if ((r.verdict == Verdict::fail || r.verdict == Verdict::pass) && std::filesystem::exists(json)) {
    nlohmann::json j;
    std::ifstream(json) >> j;
    if (r.verdict == Verdict::fail && !j["first_divergence"].is_null())
      r.detail = fmt::format("{} ({})", j["first_divergence"]["tap"].get<std::string>(),
                             fmt::join(j["first_divergence"]["checks"].get<std::vector<std::string>>(), ","));
    if (j.contains("timings")) {
      const auto& tm = j["timings"];
      r.run_seconds = tm.value("sharded_s", 0.0);
      r.check_seconds = tm.value("reference_s", 0.0) + tm.value("write_s", 0.0) + tm.value("check_s", 0.0);
    }
  } else if (r.verdict == Verdict::fail || r.verdict == Verdict::pass) {
    r.detail = missing_report_hint(json);
  }
  std::filesystem::remove(out);
  return r;
}

FlagTrialResult run_external_trial(const FlagTarget& t, const FlagSet& flags) {
  TrialSpec spec{{}, {}, t.timeout_seconds};
  const std::string joined = join_flags(flags);
  for (const auto& a : t.command) {
    if (a == "{flags}") {
      spec.argv.insert(spec.argv.end(), flags.begin(), flags.end());
      continue;
    }
    std::string s = a;
    for (auto p = s.find("{flags}"); p != std::string::npos; p = s.find("{flags}", p + joined.size()))
      s.replace(p, 7, joined);
    spec.argv.push_back(s);
  }
  if (!t.env_var.empty()) spec.env[t.env_var] = joined;
  if (!t.check_file.empty()) std::filesystem::remove(t.check_file);
  TrialOutcome o = run_trial(spec);
  FlagTrialResult r = from_outcome(o);
  if (r.verdict == Verdict::pass && !t.check_file.empty()) {
    try {
      CompareResult c = compare(read_activations(t.check_file), {});
      if (!c.pass()) {
        r.verdict = Verdict::fail;
        r.detail = "check: first divergence " + c.taps[*c.first_divergence].name;
      } else {
        r.detail = "exit 0, check passes";
      }
    } catch (const InputError& e) {
      r.verdict = Verdict::error;
      r.detail = e.what();
    }
  }
  return r;
}

}  // namespace

FlagTrialResult run_flag_trial(const FlagTarget& target, const FlagSet& flags, const std::string& workdir) {
  std::filesystem::create_directories(workdir);
  return target.external() ? run_external_trial(target, flags)
                           : run_scenario_trial(target, flags, workdir);
}

TrialCache::TrialCache(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  std::filesystem::path p(path_);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ifstream in(path_);
  std::string line;
  while (std::getline(in, line)) {
    try {
      auto j = nlohmann::json::parse(line);
      FlagTrialResult r{static_cast<Verdict>(j["verdict"].get<int>()), j["seconds"].get<double>(),
                        j["detail"].get<std::string>()};
      if (j.contains("run_seconds")) r.run_seconds = j["run_seconds"].get<double>();
      if (j.contains("check_seconds")) r.check_seconds = j["check_seconds"].get<double>();
      entries_[j["key"].get<std::string>()] = r;
    } catch (const std::exception&) {
      // A line cut short by an interrupted run: ignore it, the trial reruns.
    }
  }
}

std::optional<FlagTrialResult> TrialCache::get(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void TrialCache::put(const std::string& key, const FlagSet& flags, const FlagTrialResult& r) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_[key] = r;
  if (path_.empty()) return;
  nlohmann::json j{{"key", key}, {"flags", flags}, {"verdict", static_cast<int>(r.verdict)},
                   {"seconds", r.seconds}, {"detail", r.detail}};
  if (r.run_seconds) j["run_seconds"] = *r.run_seconds;
  if (r.check_seconds) j["check_seconds"] = *r.check_seconds;
  std::ofstream(path_, std::ios::app) << j.dump() << "\n" << std::flush;
}

namespace {

// Path, size and modification time of the program a trial runs: a rebuilt
// binary is another program, and its old verdicts do not carry over.
std::string program_identity(const std::string& name) {
  std::string path = name;
  if (name.find('/') == std::string::npos)
    if (const char* p = std::getenv("PATH")) {
      std::stringstream dirs(p);
      for (std::string d; std::getline(dirs, d, ':');)
        if (!d.empty() && access((d + "/" + name).c_str(), X_OK) == 0) {
          path = d + "/" + name;
          break;
        }
    }
  std::error_code ec;
  auto canonical = std::filesystem::canonical(path, ec);
  if (ec) return "missing:" + name;
  auto size = std::filesystem::file_size(canonical, ec);
  auto mtime = std::filesystem::last_write_time(canonical, ec).time_since_epoch().count();
  return fmt::format("{}:{}:{}", canonical.string(), size, mtime);
}

// The environment that reaches a trial, minus what shells change on their
// own and a trial does not read.
std::string environment_identity() {
  static const std::set<std::string> ignored{"_", "OLDPWD", "SHLVL", "TERM", "COLUMNS", "LINES",
                                             "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "TMUX", "TMUX_PANE"};
  std::vector<std::string> vars;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (!ignored.count(kv.substr(0, kv.find('=')))) vars.push_back(kv);
  }
  std::sort(vars.begin(), vars.end());
  return fmt::format("{}", fmt::join(vars, "\x1e"));
}

}  // namespace

std::string TrialCache::key_of(const FlagTarget& t, const FlagSet& flags, int repeat) {
  FlagSet sorted = flags;
  std::sort(sorted.begin(), sorted.end());
  const std::string programs = t.external() ? program_identity(t.command.front())
                                            : program_identity(self_executable()) + " " + program_identity(t.mpirun);
  std::string text = fmt::format("{}\n{}\nrepeat={}\n{}\n{}", t.identity(), fmt::join(sorted, "\x1f"), repeat,
                                 programs, environment_identity());
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

}  // namespace dc
