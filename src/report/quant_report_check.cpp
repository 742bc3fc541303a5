// check_quant_report: what the renderers refuse (quant_report.hpp). Values that are not finite are
// not refused: they mean "not measured" and are printed as a dash.
#include <cmath>
#include <limits>

#include "llmq/quant_report.hpp"

namespace llmq {

Status check_quant_report(const QuantReport& report) {
  const QuantReportSensitivity& s = report.sensitivity;
  const size_t units = s.units.size(), schemes = s.schemes.size();
  if (units != 0 && schemes > std::numeric_limits<size_t>::max() / units) {
    return invalid_argument("sensitivity: " + std::to_string(units) + " units x " + std::to_string(schemes) +
                            " schemes is too large");
  }
  if (s.kl.size() != units * schemes) {
    return invalid_argument("sensitivity.kl: expected units x schemes = " + std::to_string(units) + " x " +
                            std::to_string(schemes) + " values, got " + std::to_string(s.kl.size()));
  }
  const QuantReportCandidate* recipe = nullptr;
  for (const auto& c : report.candidates) {
    if (!c.is_recipe) continue;
    if (recipe != nullptr) {
      return invalid_argument("candidates: two are flagged as the recipe: '" + recipe->name + "' and '" + c.name + "'");
    }
    recipe = &c;
  }
  for (size_t i = 0; i < report.outliers.size(); ++i) {
    const QuantReportOutlierSite& o = report.outliers[i];
    for (size_t c = 0; c < o.channel_absmax.size(); ++c) {
      const float v = o.channel_absmax[c];
      if (std::isfinite(v) && v < 0) {
        return invalid_argument("outliers[" + std::to_string(i) + "] (" + o.module + ").channel_absmax[" +
                                std::to_string(c) + "]: an absmax cannot be negative (" + std::to_string(v) + ")");
      }
    }
  }
  return Status::ok_status();
}

}  // namespace llmq
