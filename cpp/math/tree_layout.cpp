#include "math/tree_layout.h"

#include <algorithm>

#include "errors.h"
#include "device/join.h"

namespace speculant {

Nodes::Nodes(const std::vector<TreeInput>& rows)
    : rows(rows), base(rows.size() + 1, 0), q_base(rows.size() + 1, 0), token_base(rows.size() + 1, 0) {
  for (size_t r = 0; r < rows.size(); ++r) {
    base[r + 1] = base[r] + rows[r].tree->size();
    q_base[r + 1] = q_base[r] + rows[r].q.size(0);
    token_base[r + 1] = token_base[r] + rows[r].tokens.size(0);
    chain_form.push_back(rows[r].chain_form());
    widest = std::max(widest, rows[r].tree->max_children());
    row_of.resize(base[r + 1], static_cast<int64_t>(r));
  }
  size = base.back();
  tokens = every_row(&TreeInput::tokens);
  siblings_law = rows.front().sibling_q.defined();
  for (const TreeInput& row : rows) {
    require(row.sibling_q.defined() == siblings_law, "a batch's rows all have a sibling law, or none");
  }
}

at::Tensor Nodes::every_row(at::Tensor TreeInput::*field) const {
  std::vector<at::Tensor> parts;
  for (const TreeInput& row : rows) parts.push_back(row.*field);
  return joined(parts);
}

bool consecutive(const std::vector<int64_t>& rows) {
  for (size_t i = 1; i < rows.size(); ++i) {
    if (rows[i] != rows[0] + static_cast<int64_t>(i)) return false;
  }
  return true;
}

at::Tensor take_rows(const at::Tensor& from, const std::vector<int64_t>& rows, const at::Tensor& index) {
  if (consecutive(rows)) return from.narrow(0, rows.empty() ? 0 : rows[0], static_cast<int64_t>(rows.size()));
  return from.index_select(0, index);
}

void put_rows(at::Tensor& to, const std::vector<int64_t>& rows, const at::Tensor& index, const at::Tensor& values) {
  if (consecutive(rows)) {
    to.narrow(0, rows.empty() ? 0 : rows[0], static_cast<int64_t>(rows.size())).copy_(values);
  } else {
    to.index_copy_(0, index, values);
  }
}

namespace {

// The layout's order, coins and lists (Layout above).
void layout_lists(const Nodes& nodes, Layout& layout) {
  std::vector<int64_t>& order = layout.order;
  for (int64_t node = 0; node < nodes.size; ++node) {
    if (nodes.children(node) > 0) order.push_back(node);
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (layout.block && nodes.depth(a) != nodes.depth(b)) return nodes.depth(a) < nodes.depth(b);
    return nodes.children(a) > nodes.children(b);
  });
  layout.internal = static_cast<int64_t>(order.size());
  for (int64_t node = 0; node < nodes.size; ++node) {
    if (nodes.children(node) == 0) order.push_back(node);
  }
  layout.leading.assign(nodes.widest + 1, 0);
  for (int64_t i = 0; i < layout.internal; ++i) {
    for (int64_t j = 0; j < nodes.children(order[i]); ++j) ++layout.leading[j];
  }
  std::vector<int64_t> draw_at(nodes.size);
  for (size_t r = 0, offset = 0; r < nodes.rows.size(); ++r) {
    const Tree& tree = nodes.tree(static_cast<int64_t>(r));
    const int64_t width = std::max<int64_t>(tree.max_children(), 1), base = nodes.base[r];
    int64_t coins = 0;
    for (int64_t node = 0; node < tree.size(); ++node) {
      if (tree.children(node) > 0) layout.coin_at[base + node] = offset + width * coins++;
    }
    for (int64_t node = 0; node < tree.size(); ++node) draw_at[base + node] = offset + width * coins + node;
    layout.uniform_sizes.push_back(width * coins + tree.size());
    offset += layout.uniform_sizes.back();
  }
  for (int64_t i = 0; i < layout.internal; ++i) {
    layout.q_rows.push_back(nodes.q_row(order[i]));
    const int64_t first = nodes.first_child(order[i]);
    for (int64_t j = 0; j < nodes.widest; ++j) {
      const int64_t child = j < nodes.children(order[i]) ? j : 0;
      layout.children.push_back(nodes.token(first + child));
      layout.coins.push_back(layout.coin_at[order[i]] + child);
    }
  }
  for (int64_t i = 0; i < nodes.size; ++i) layout.draw_of.push_back(draw_at[order[i]]);
}

// Traversal verification's depth ranges and edges (Layout above).
void traversal_lists(const Nodes& nodes, Layout& layout) {
  for (int64_t i = 0; i < layout.internal; ++i) {
    if (i == 0 || nodes.depth(layout.order[i]) != nodes.depth(layout.order[i - 1])) layout.level_start.push_back(i);
  }
  layout.level_start.push_back(layout.internal);
  layout.edge_of.assign(nodes.size, 0);
  for (int64_t i = 0; i < nodes.size; ++i) {
    const int64_t node = layout.order[i], r = nodes.row_of[node], local = node - nodes.base[r];
    if (local == 0) continue;
    const Tree& tree = nodes.tree(r);
    layout.edge_of[i] = layout.position[nodes.base[r] + tree.parent(local)] * nodes.widest + tree.rank(local);
  }
}

}  // namespace

Layout::Layout(const Nodes& nodes, const SamplingConfig& config)
    : greedy(config.greedy()), block(config.block()), position(nodes.size), coin_at(nodes.size, 0) {
  layout_lists(nodes, *this);
  for (int64_t i = 0; i < nodes.size; ++i) position[order[i]] = i;
  if (block) traversal_lists(nodes, *this);
  const auto lists = taken();
  if (!std::all_of(lists.begin(), lists.end(), [](const auto* list) { return consecutive(*list); })) {
    for (const auto* list : lists) index.insert(index.end(), list->begin(), list->end());
  }
}

std::vector<const std::vector<int64_t>*> Layout::taken() const {
  if (greedy) return {&order, &q_rows, &children};
  if (block) return {&order, &q_rows, &children, &draw_of, &coins, &edge_of};
  return {&order, &q_rows, &children, &draw_of, &coins};
}

at::Tensor Layout::uniforms(const Nodes& nodes, const at::Device& device) const {
  std::vector<at::Tensor> blocks;
  for (size_t r = 0; r < nodes.rows.size(); ++r) {
    // the coins from the row's coin stream, the candidates' uniforms from its correction stream
    const int64_t candidates = nodes.tree(static_cast<int64_t>(r)).size();
    blocks.push_back(scaled_uniforms({uniform_sizes[r] - candidates}, *nodes.rows[r].coins, device));
    blocks.push_back(scaled_uniforms({candidates}, *nodes.rows[r].correction, device));
  }
  return joined(blocks);
}

DeviceInputs::DeviceInputs(const std::vector<at::Tensor>& in, const Nodes& nodes, const Layout& layout)
    : logits(in[0]), q(in[1]), tokens(in[2]) {
  size_t next = 3;
  if (!layout.greedy) uniforms = in[next++];
  if (nodes.siblings_law) sibling = in[next++];
  const auto lists = layout.taken();
  taken.resize(lists.size());
  if (!layout.index.empty()) {
    int64_t at = 0;
    for (size_t i = 0; i < lists.size(); ++i) {
      const auto size = static_cast<int64_t>(lists[i]->size());
      taken[i] = in[next].narrow(0, at, size);
      at += size;
    }
    ++next;
  }
  witnesses = next;
}

}  // namespace speculant
