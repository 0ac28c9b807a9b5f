// Runs the built memsim binary (MEMSIM_BINARY) in a scratch directory and captures its exit code,
// standard output and standard error, for end-to-end tests of the subcommands.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace memsim::testing {

// A fresh directory under the system temp dir, removed with its contents on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("memsim-test-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(++counter));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::filesystem::remove_all(path_);
    std::filesystem::remove(path_.string() + ".stdout");
    std::filesystem::remove(path_.string() + ".stderr");
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::filesystem::path Write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return path_ / name;
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `memsim ARGS` with DIR as the working directory. ARGS is passed to the shell as is.
// Standard output and error are captured beside DIR, so DIR holds only what memsim wrote.
inline CommandResult RunMemsim(const ScratchDir& dir, const std::string& args) {
  const std::filesystem::path out = dir.path().string() + ".stdout";
  const std::filesystem::path err = dir.path().string() + ".stderr";
  const std::string cmd = "cd '" + dir.path().string() + "' && '" MEMSIM_BINARY "' " + args +
                          " > '" + out.string() + "' 2> '" + err.string() + "'";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadAll(out), ReadAll(err)};
}

struct CombinedResult {
  int exit_code = -1;
  std::string output;  // standard output and error, interleaved as printed
};

// Runs `memsim ARGS` in the current directory, capturing both streams together.
inline CombinedResult RunMemsimCombined(const std::string& args) {
  const std::string command = "'" MEMSIM_BINARY "' " + args + " 2>&1";
  CombinedResult r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) r.output.append(buffer, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace memsim::testing
