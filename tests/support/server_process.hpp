// A gpukv-server process for tests that must stop a server the way a crash does (SIGKILL) and start it
// again: the real binary on 127.0.0.1, its output in a log file, its ports read from the line it prints once
// it serves. A restart keeps the gRPC port, as a StatefulSet pod keeps its name.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace gpukv::test {

class ServerProcess {
 public:
  // Starts `binary` with `flags` plus --listen=127.0.0.1:0 and --metrics_listen=127.0.0.1:0, and `env`
  // ("NAME=value") added to this process' environment; returns once it serves. Throws std::runtime_error
  // with the log if it does not within 60 s.
  ServerProcess(std::string binary, std::vector<std::string> flags, std::string log_path, std::vector<std::string> env = {})
      : binary_(std::move(binary)), flags_(std::move(flags)), log_path_(std::move(log_path)), env_(std::move(env)) {
    start("127.0.0.1:0");
  }
  ~ServerProcess() { kill(SIGKILL); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  bool running() const { return pid_ > 0; }

  // Sends `signal` and waits for the process to end; returns its wait status (0 if it was not running).
  int kill(int signal) {
    if (pid_ <= 0) return 0;
    ::kill(pid_, signal);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

  // Starts it again on the same gRPC port, with the same flags plus `extra`.
  void restart(const std::vector<std::string>& extra = {}) {
    if (pid_ > 0) throw std::logic_error("restart of a running server");
    std::vector<std::string> flags = flags_;
    flags.insert(flags.end(), extra.begin(), extra.end());
    std::swap(flags, flags_);
    start("127.0.0.1:" + std::to_string(port_));
    std::swap(flags, flags_);
  }

  std::string log() const {
    std::ifstream in(log_path_);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  void start(const std::string& listen) {
    std::vector<std::string> argv_strings{binary_, "--listen=" + listen, "--metrics_listen=127.0.0.1:0"};
    argv_strings.insert(argv_strings.end(), flags_.begin(), flags_.end());
    std::vector<char*> argv;
    for (std::string& a : argv_strings) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::size_t from = log().size();  // a restart appends to the same log
    const int log_fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) throw std::runtime_error("cannot write " + log_path_);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(log_fd, STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
      for (std::string& e : env_) putenv(e.data());
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(log_fd);
    if (pid_ < 0) throw std::runtime_error("fork failed");
    const std::regex serving("listening on port (\\d+), metrics on port (\\d+)");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      std::smatch m;
      const std::string text = log().substr(from);
      if (std::regex_search(text, m, serving)) {
        port_ = std::stoi(m[1]);
        return;
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("gpukv-server exited at start: " + text);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(SIGKILL);
    throw std::runtime_error("gpukv-server did not start within 60 s: " + log());
  }

  std::string binary_;
  std::vector<std::string> flags_;
  std::string log_path_;
  std::vector<std::string> env_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace gpukv::test
