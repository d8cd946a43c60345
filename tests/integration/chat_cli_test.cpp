// `tessera chat` driven through a pseudo-terminal, as a person would: two
// turns streamed, the second turn's prompt carrying the first (the rendered
// prompts come back on --show-prompt), /reset forgetting, /exit leaving; and
// `run --chat` answering one turn as the chat does.
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "cli_util.h"

namespace tessera {
namespace {

using testing::kBin;
using testing::kData;

// A process on the far side of a pseudo-terminal.
class Pty {
 public:
  explicit Pty(const std::vector<std::string>& args) {
    pid_ = ::forkpty(&fd_, nullptr, nullptr, nullptr);
    if (pid_ == 0) {
      std::vector<char*> argv{const_cast<char*>("tessera")};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(kBin.c_str(), argv.data());
      ::_exit(127);
    }
  }
  ~Pty() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  bool started() const { return pid_ > 0; }
  void send(const std::string& line) { ASSERT_EQ(::write(fd_, line.data(), line.size()), static_cast<ssize_t>(line.size())); }
  // Everything printed until `marker` appears after `from` (or 60 s pass, or the process leaves).
  std::string read_until(const std::string& marker) {
    const size_t from = seen_.size();
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (seen_.find(marker, from) == std::string::npos && std::chrono::steady_clock::now() < end) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof(buf));
      if (n <= 0) break;  // the other side closed
      seen_.append(buf, static_cast<size_t>(n));
    }
    return seen_.substr(from);
  }
  int wait_exit() {
    int status = 0;
    for (const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60); std::chrono::steady_clock::now() < end;) {
      read_until("\x01");  // drain what it prints, so that it never blocks on a full terminal
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
    }
    return -2;
  }

 private:
  int fd_ = -1;
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string seen_;
};

// The text between the n-th "[prompt]" and its "[/prompt]" (terminals print \r\n).
std::string prompt_of(const std::string& s) {
  const size_t a = s.find("[prompt]"), b = s.find("[/prompt]");
  if (a == std::string::npos || b == std::string::npos) return "";
  std::string p = s.substr(a + 8, b - a - 8);
  std::string out;
  for (size_t i = 0; i < p.size(); ++i)
    if (!(p[i] == '\r' && i + 1 < p.size() && p[i + 1] == '\n')) out += p[i];
  return out;
}

TEST(ChatCliTest, TwoTurnsResetAndExitThroughATerminal) {
  // Short turns: the tiny model has 128 positions, and ChatML in a 512-token
  // byte-level vocabulary costs many of them.
  Pty chat({"chat", "--model", kData + "/gpt2-chat", "--greedy", "--max-tokens", "3", "--show-prompt", "--system", "Hi"});
  ASSERT_TRUE(chat.started());
  const std::string banner = chat.read_until("\n> ");
  ASSERT_NE(banner.find("tessera chat"), std::string::npos) << banner;

  chat.send("hi\n");
  const std::string first = chat.read_until("\n> ");
  const std::string p1 = prompt_of(first);
  EXPECT_EQ(p1, "<|im_start|>system\nHi<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") << first;
  EXPECT_EQ(first.find("error"), std::string::npos) << first;

  chat.send("ok\n");
  const std::string second = chat.read_until("\n> ");
  EXPECT_EQ(second.find("error"), std::string::npos) << second;
  const std::string p2 = prompt_of(second);
  // The second prompt carries the first turn whole: its user message and the answer.
  ASSERT_EQ(p2.rfind(p1, 0), 0u) << p2;
  EXPECT_NE(p2.find("<|im_end|>\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n", p1.size()), std::string::npos)
      << p2;

  chat.send("/reset\n");
  EXPECT_NE(chat.read_until("\n> ").find("(conversation reset)"), std::string::npos);
  chat.send("yo\n");
  const std::string third = prompt_of(chat.read_until("\n> "));
  EXPECT_EQ(third, "<|im_start|>system\nHi<|im_end|>\n<|im_start|>user\nyo<|im_end|>\n<|im_start|>assistant\n");

  chat.send("/exit\n");
  EXPECT_EQ(chat.wait_exit(), 0);
}

TEST(ChatCliTest, RunChatAnswersOneTurnAsChatDoes) {
  const auto one = testing::run("run --model " + kData + "/gpt2-chat --chat 'hello there' --greedy --generate 4");
  ASSERT_EQ(one.code, 0) << one.err;
  // The same turn on two devices gives the same answer.
  const auto two = testing::run("run --model " + kData + "/gpt2-chat --chat 'hello there' --greedy --generate 4 --strategy tp --devices 2");
  ASSERT_EQ(two.code, 0) << two.err;
  EXPECT_EQ(one.out, two.out);
  // A model without a template says so.
  const auto none = testing::run("run --model " + kData + "/gpt2-tiny --chat hi");
  EXPECT_NE(none.code, 0);
  EXPECT_FALSE(none.err.empty());
}

}  // namespace
}  // namespace tessera
