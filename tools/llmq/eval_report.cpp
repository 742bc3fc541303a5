// `llmq eval`'s report (eval_command.hpp): the accuracy table or --json, the same for both routes.
#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "eval_command.hpp"
#include "eval_table.hpp"

namespace llmq::cli {

int print_eval_report(const EvalArgs& a, const EvalReport& r) {
  const std::vector<EvalAccumulator::Summary>& sums = r.sums;
  // What it took, on stderr: stdout stays the same for the same numbers (any --threads).
  std::fprintf(stderr, "llmq: eval: evaluation %.2f s, whole command %.2f s; %s\n", r.seconds, r.total_seconds,
               r.memory.c_str());
  if (a.json) {
    nlohmann::ordered_json j;
    j["model"] = r.model;
    j["data"] = r.data;
    j["reference"] = r.reference;
    j["fp8_fast_accumulation"] = r.fp8_fast_accum;
    j["tokens"] = sums.empty() ? 0 : sums[0].tokens;
    j["ppl_base"] = sums.empty() ? 0 : sums[0].ppl_base;
    j["results"] = nlohmann::ordered_json::array();
    for (size_t i = 0; i < sums.size(); ++i) {
      const auto& s = sums[i];
      nlohmann::ordered_json weights = nullptr;
      if (const WeightError* w = r.weight_errors[i])
        weights = {{"rel_l2", w->rel_l2}, {"expert_rel_l2", w->expert_rel_l2}, {"exact_fraction", w->exact_fraction},
                   {"elements", w->elements}};
      j["results"].push_back({{"scheme", r.labels[i]},
                              {"kv_cache", r.kv_caches[i]},
                              {"weight_error", weights},
                              {"ppl", s.ppl_quant},
                              {"ppl_err", s.ppl_quant_err},
                              {"ppl_ratio", s.ppl_ratio},
                              {"ppl_ratio_err", s.ppl_ratio_err},
                              {"kl_mean", s.kl.mean},
                              {"kl_mean_err", s.kl.stderr_},
                              {"kl_median", s.kl_median},
                              {"kl_p99", s.kl_p99},
                              {"kl_max", s.kl_max},
                              {"top1", s.top1_agreement.mean},
                              {"top1_err", s.top1_agreement.stderr_},
                              {"delta_p_mean", s.delta_p.mean},
                              {"delta_p_err", s.delta_p.stderr_},
                              {"delta_p_rms", s.delta_p_rms}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model: %s\ndata:  %s\nreference: %s\ntokens scored: %lld, context %lld\n", r.model.c_str(), r.data.c_str(),
              r.reference.c_str(), static_cast<long long>(sums.empty() ? 0 : sums[0].tokens),
              static_cast<long long>(r.context));
  if (!sums.empty()) std::printf("unquantized perplexity: %.4f +- %.4f\n", sums[0].ppl_base, sums[0].ppl_base_err);
  // The weights' own error beside the model's: for MoE models the experts' (gpt-oss read from
  // MXFP4: how far the requantized experts are from the exact MXFP4 values).
  std::vector<EvalRow> rows;
  for (size_t i = 0; i < sums.size(); ++i) {
    const WeightError* w = r.weight_errors[i];
    rows.push_back({r.labels[i], sums[i], {w ? fmt::format("{:.2e}", r.moe ? w->expert_rel_l2 : w->rel_l2) : "-"}});
  }
  sort_by_kl(&rows);
  EvalTableOptions table;
  table.extra_headers = {"wt err"};
  table.extra_notes = {std::string("wt err     ||W_q - W|| / ||W|| of the quantized ") + (r.moe ? "experts" : "weights") +
                       " (--json: every linear,\n           experts, exact share; -: quantized on the GPU or read quantized)"};
  std::printf("\n%s", eval_table_text(rows, table).c_str());
  return 0;
}

}  // namespace llmq::cli
