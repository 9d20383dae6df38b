// Rank 0's start order to the followers, natively: one TCP connection from rank 0 to each
// follower, one frame per wake-up of rank 0's Core carrying every sub-task it started (the
// Python Core announces over the rank-0 channel instead, bytesched/core/channel). Set up once:
// rank 0 listens on a free port, the plugin shares the port through the backend's broadcast,
// each follower connects and proves it belongs to the job with a digest of the job token.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scheduler.h"

namespace bytesched {

class LinkError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One frame's keys, and for each whether it joins the previous key's batch (bit 31 of its index
// on the wire, as in the rank-0 channel's ORDER payload).
std::string encode_order(const std::vector<Key>& keys, const std::vector<bool>& joins);
void decode_order(const std::string& payload, std::vector<Key>* keys, std::vector<bool>* joins);

class OrderLink {
 public:
  OrderLink() = default;
  ~OrderLink();
  OrderLink(const OrderLink&) = delete;
  OrderLink& operator=(const OrderLink&) = delete;

  // Rank 0: listen on ``host`` at a free port; returns the port.
  int listen(const std::string& host);
  // Rank 0: accept one connection from each of the ``followers`` ranks 1..followers whose hello
  // carries ``digest``, within ``timeout_s`` (LinkError naming the missing ranks otherwise).
  void accept(int followers, const std::string& digest, double timeout_s);
  // Rank 0: one frame to every follower (LinkError if a follower's connection failed).
  void send(const std::string& payload);

  // A follower: connect to rank 0 (retrying until ``timeout_s``) and say hello.
  void connect(const std::string& host, int port, int rank, const std::string& digest, double timeout_s);
  // A follower: the next frame; false once rank 0 closed the connection (or close() was called).
  bool receive(std::string* payload);

  // Close every connection (wakes a receive() in progress).
  void close();

 private:
  int listener_ = -1;
  int upstream_ = -1;             // a follower's connection to rank 0
  std::vector<int> followers_;    // rank 0's connections, by rank - 1
};

}  // namespace bytesched
