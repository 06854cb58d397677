// scan_layers' homogeneity check and parameter stacking.
#include "loom/nn/scan_layers.h"

#include <map>

namespace loom::detail {

StackedLayers stack_layers(const nn::ModuleList& layers) {
  StackedLayers st;
  auto tensors_of = [](const nn::Module& m) {
    std::vector<std::pair<std::string, Tensor>> all = m.named_parameters();
    for (auto& b : m.named_buffers()) all.push_back(b);
    return all;
  };
  auto first = tensors_of(*layers[0]);
  std::map<std::string, size_t> index;
  for (size_t k = 0; k < first.size(); ++k) {
    index[first[k].first] = k;
    st.targets.push_back(first[k].second);
    st.names.push_back(first[k].first);
  }
  std::vector<std::vector<Tensor>> per(first.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    auto mine = tensors_of(*layers[i]);
    std::map<std::string, Tensor> by_name(mine.begin(), mine.end());
    for (auto& [name, t] : first) {
      auto it = by_name.find(name);
      LOOM_CHECK_T(ShapeError, it != by_name.end(), "[scan_layers] layer ", i,
                   " differs from layer 0: it has no '", name,
                   "'; scan_layers needs homogeneous layers");
      TensorType want{t.dtype(), t.shape()}, got{it->second.dtype(), it->second.shape()};
      LOOM_CHECK_T(ShapeError, want == got, "[scan_layers] layer ", i, " differs from layer 0: '",
                   name, "' is ", got, " in layer ", i, " but ", want, " in layer 0");
      per[index[name]].push_back(it->second);
    }
    for (auto& [name, t] : mine)
      LOOM_CHECK_T(ShapeError, index.count(name), "[scan_layers] layer ", i,
                   " differs from layer 0: it has an extra '", name, "'");
  }
  for (auto& ts : per) st.stacked.push_back(loom::stack(ts, 0));
  return st;
}

}  // namespace loom::detail
