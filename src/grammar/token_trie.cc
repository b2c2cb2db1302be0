// Building the preorder trie from the tokens sorted by their bytes: each token adds nodes
// only for the bytes past its longest common prefix with the previous token, and those new
// nodes are exactly the next nodes in preorder. Identical tokens (several ids with the same
// bytes) end at the same node; sorting keeps them adjacent, so each node's ids are a range.
#include "grammar/token_trie.h"

#include <algorithm>
#include <numeric>

namespace tinyloop::grammar {

TokenTrie::TokenTrie(const std::vector<std::string>& tokens) {
  std::vector<int32_t> order;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (!tokens[i].empty()) order.push_back(static_cast<int32_t>(i));
  // std::string compares bytes as unsigned char (char_traits<char>::lt), so this is byte order.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });

  std::vector<int32_t> path;  // node index per depth - 1 along the current token
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& t = tokens[id];
    size_t lcp = 0;
    if (prev) {
      size_t m = std::min(prev->size(), t.size());
      while (lcp < m && (*prev)[lcp] == t[lcp]) ++lcp;
    }
    // Close the subtrees of the nodes deeper than the shared prefix.
    for (size_t d = lcp; d < path.size(); ++d) nodes_[path[d]].subtree_end = static_cast<int32_t>(nodes_.size());
    path.resize(lcp);
    for (size_t d = lcp; d < t.size(); ++d) {
      path.push_back(static_cast<int32_t>(nodes_.size()));
      int32_t tb = static_cast<int32_t>(token_ids_.size());
      nodes_.push_back({static_cast<int32_t>(d + 1), -1, tb, tb, static_cast<uint8_t>(t[d])});
    }
    Node& end = nodes_[path.back()];
    // The ids of one node stay contiguous: a token ending at a node sorts before every
    // extension, so the only ids pushed since the node was made are its duplicates.
    token_ids_.push_back(id);
    end.tokens_end = static_cast<int32_t>(token_ids_.size());
    max_depth_ = std::max(max_depth_, static_cast<int32_t>(t.size()));
    prev = &t;
  }
  for (int32_t n : path) nodes_[n].subtree_end = static_cast<int32_t>(nodes_.size());
}

}  // namespace tinyloop::grammar
