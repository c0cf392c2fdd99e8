#include "harness/search/launcher.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>

#include "harness/core/error.h"

namespace dc {
namespace {

std::vector<std::string> shell_words(const std::string& s) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == quote) {
        quote = 0;
      } else if (c == '\\' && quote == '"' && i + 1 < s.size()) {
        word += s[++i];
      } else {
        word += c;
      }
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == '\\' && i + 1 < s.size()) {
      word += s[++i];
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (quote) input_error("--launcher '{}': unterminated {} quote", s, quote);
  if (in_word) words.push_back(word);
  return words;
}

}  // namespace

std::vector<std::string> launcher_argv(const std::string& launcher, const std::string& mpirun, int ranks) {
  const std::string n = std::to_string(std::max(1, ranks));
  if (launcher.empty()) return {mpirun, "-n", n};
  auto words = shell_words(launcher);
  if (words.empty()) input_error("--launcher '{}': no command", launcher);
  for (auto& w : words)
    for (std::size_t at; (at = w.find("{n}")) != std::string::npos;) w.replace(at, 3, n);
  return words;
}

std::string scratch_directory(const std::string& work_dir, const std::string& stem) {
  const std::filesystem::path base = work_dir.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(work_dir);
  const auto dir = base / fmt::format("{}_{}", stem, ::getpid());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) input_error("cannot make the trials' scratch directory '{}': {}", dir.string(), ec.message());
  return dir.string();
}

std::string missing_report_hint(const std::string& report) {
  return fmt::format(
      "no report at '{}' after the trial: if the launcher starts rank 0 on another host, give --work-dir a "
      "directory that host and this one share",
      report);
}

}  // namespace dc
