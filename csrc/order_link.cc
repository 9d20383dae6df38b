// Rank 0's order link (see order_link.h).
#include "order_link.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace bytesched {

namespace {

constexpr uint32_t kHello = 0x62734f31;  // "bsO1"
constexpr uint32_t kJoins = 1u << 31;
constexpr size_t kDigestBytes = 32;
constexpr uint32_t kMaxFrame = 64u << 20;

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string os_error(const std::string& what) { return what + ": " + std::strerror(errno); }

void put_u32(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void put_u64(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t get_le(const std::string& in, size_t* at, int bytes) {
  if (*at + bytes > in.size()) throw LinkError("a truncated order frame");
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(in[*at + i])) << (8 * i);
  *at += bytes;
  return value;
}

bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t sent = ::send(fd, data, size, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += sent;
    size -= static_cast<size_t>(sent);
  }
  return true;
}

// Read exactly ``size`` bytes; false on end of stream or error.
bool read_all(int fd, char* data, size_t size) {
  while (size > 0) {
    ssize_t got = ::recv(fd, data, size, 0);
    if (got == 0) return false;
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += got;
    size -= static_cast<size_t>(got);
  }
  return true;
}

// Wait until ``fd`` is readable, up to ``deadline`` (seconds_now()); false on timeout.
bool readable_by(int fd, double deadline) {
  while (true) {
    double left = deadline - seconds_now();
    if (left <= 0) return false;
    pollfd entry{fd, POLLIN, 0};
    int ready = ::poll(&entry, 1, static_cast<int>(left * 1000) + 1);
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return false;
  }
}

void no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) throw LinkError("order link: cannot resolve " + host + ": " + gai_strerror(rc));
  return found;
}

}  // namespace

std::string encode_order(const std::vector<Key>& keys, const std::vector<bool>& joins) {
  std::string out;
  put_u32(out, static_cast<uint32_t>(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) {
    const Key& key = keys[i];
    put_u32(out, static_cast<uint32_t>(key.name.size()));
    out += key.name;
    put_u64(out, static_cast<uint64_t>(key.instance));
    put_u32(out, static_cast<uint32_t>(key.index) | (joins[i] ? kJoins : 0u));
  }
  return out;
}

void decode_order(const std::string& payload, std::vector<Key>* keys, std::vector<bool>* joins) {
  size_t at = 0;
  uint64_t count = get_le(payload, &at, 4);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t length = get_le(payload, &at, 4);
    if (at + length > payload.size()) throw LinkError("a truncated order frame");
    Key key{payload.substr(at, length), 0, 0};
    at += length;
    key.instance = static_cast<int64_t>(get_le(payload, &at, 8));
    uint32_t index = static_cast<uint32_t>(get_le(payload, &at, 4));
    key.index = static_cast<int32_t>(index & ~kJoins);
    keys->push_back(std::move(key));
    joins->push_back((index & kJoins) != 0);
  }
  if (at != payload.size()) throw LinkError("an order frame with trailing bytes");
}

OrderLink::~OrderLink() {
  close();
  if (upstream_ >= 0) ::close(upstream_);
}

int OrderLink::listen(const std::string& host) {
  addrinfo* found = resolve(host, 0, true);
  std::string error = "order link: no address of " + host + " to listen on";
  for (addrinfo* at = found; at != nullptr; at = at->ai_next) {
    int fd = ::socket(at->ai_family, at->ai_socktype | SOCK_CLOEXEC, at->ai_protocol);
    if (fd < 0) continue;
    if (::bind(fd, at->ai_addr, at->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      listener_ = fd;
      break;
    }
    error = os_error("order link: listening on " + host);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (listener_ < 0) throw LinkError(error);
  sockaddr_storage bound{};
  socklen_t size = sizeof(bound);
  ::getsockname(listener_, reinterpret_cast<sockaddr*>(&bound), &size);
  return ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

void OrderLink::accept(int followers, const std::string& digest, double timeout_s) {
  followers_.assign(followers, -1);
  int joined = 0;
  double deadline = seconds_now() + timeout_s;
  while (joined < followers) {
    if (!readable_by(listener_, deadline)) {
      std::string missing;
      for (int r = 0; r < followers; ++r)
        if (followers_[r] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r + 1);
      throw LinkError("order link: rank(s) " + missing + " did not connect to rank 0 within " +
                      std::to_string(static_cast<int>(timeout_s)) + " s");
    }
    int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    // hello: magic, rank, digest of the job token; a stranger is dropped
    std::string hello(8 + kDigestBytes, '\0');
    if (!readable_by(fd, deadline) || !read_all(fd, hello.data(), hello.size())) {
      ::close(fd);
      continue;
    }
    size_t at = 0;
    uint32_t magic = static_cast<uint32_t>(get_le(hello, &at, 4));
    int rank = static_cast<int>(get_le(hello, &at, 4));
    if (magic != kHello || rank < 1 || rank > followers || followers_[rank - 1] >= 0 ||
        hello.compare(8, kDigestBytes, digest) != 0) {
      ::close(fd);
      continue;
    }
    no_delay(fd);
    followers_[rank - 1] = fd;
    ++joined;
  }
  ::close(listener_);
  listener_ = -1;
}

void OrderLink::send(const std::string& payload) {
  std::string frame;
  frame.reserve(payload.size() + 4);
  put_u32(frame, static_cast<uint32_t>(payload.size()));
  frame += payload;
  for (size_t r = 0; r < followers_.size(); ++r) {
    if (!write_all(followers_[r], frame.data(), frame.size()))
      throw LinkError(os_error("order link: sending rank 0's order to rank " + std::to_string(r + 1)));
  }
}

void OrderLink::connect(const std::string& host, int port, int rank, const std::string& digest, double timeout_s) {
  if (digest.size() != kDigestBytes) throw LinkError("order link: the job token's digest must be 32 bytes");
  double deadline = seconds_now() + timeout_s;
  std::string error;
  while (upstream_ < 0) {
    addrinfo* found = resolve(host, port, false);
    for (addrinfo* at = found; at != nullptr && upstream_ < 0; at = at->ai_next) {
      int fd = ::socket(at->ai_family, at->ai_socktype | SOCK_CLOEXEC, at->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, at->ai_addr, at->ai_addrlen) == 0) upstream_ = fd;
      else {
        error = os_error("connecting");
        ::close(fd);
      }
    }
    ::freeaddrinfo(found);
    if (upstream_ < 0) {
      if (seconds_now() >= deadline)
        throw LinkError("order link: rank " + std::to_string(rank) + " could not reach rank 0 at " + host + ":" +
                        std::to_string(port) + " within " + std::to_string(static_cast<int>(timeout_s)) + " s (" +
                        error + ")");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  no_delay(upstream_);
  std::string hello;
  put_u32(hello, kHello);
  put_u32(hello, static_cast<uint32_t>(rank));
  hello += digest;
  if (!write_all(upstream_, hello.data(), hello.size())) throw LinkError(os_error("order link: hello to rank 0"));
}

bool OrderLink::receive(std::string* payload) {
  char header[4];
  if (upstream_ < 0 || !read_all(upstream_, header, 4)) return false;
  size_t at = 0;
  uint32_t size = static_cast<uint32_t>(get_le(std::string(header, 4), &at, 4));
  if (size > kMaxFrame) throw LinkError("order link: a frame of " + std::to_string(size) + " bytes");
  payload->resize(size);
  return read_all(upstream_, payload->data(), size);
}

void OrderLink::close() {
  for (int& fd : followers_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  if (upstream_ >= 0) ::shutdown(upstream_, SHUT_RDWR);  // wakes a receive(); closed by the destructor
  if (listener_ >= 0) ::close(listener_);
  listener_ = -1;
}

}  // namespace bytesched
