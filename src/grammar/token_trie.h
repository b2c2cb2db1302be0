// The vocabulary as a byte trie, flattened in preorder: a mask is one forward scan over
// this array that jumps over whole subtrees once a prefix is dead. Tokens that share a
// prefix share the work for it, and the scan touches memory sequentially.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tinyloop::grammar {

class TokenTrie {
 public:
  struct Node {
    int32_t depth;  // bytes from the root; the node's byte is byte #depth-1 of its tokens
    int32_t subtree_end;  // index of the first node after this node's subtree
    int32_t tokens_begin, tokens_end;  // ids of the tokens that end here, in token_ids()
    uint8_t byte;
  };

  // Empty strings get no node (they are never allowed: they would not advance the grammar).
  explicit TokenTrie(const std::vector<std::string>& tokens);

  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  int32_t max_depth() const { return max_depth_; }

 private:
  std::vector<Node> nodes_;
  std::vector<int32_t> token_ids_;
  int32_t max_depth_ = 0;
};

}  // namespace tinyloop::grammar
