// The exit gate's arithmetic (runtime/gate_exit.h): the exit distribution, the threshold
// and step decisions, and how a call's kwargs resolve against the file's config. The
// engine-level agreement with Ouro's reference rule is tested from Python
// (tests/python/test_ouro_exit.py).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "runtime/gate_exit.h"

namespace tinyloop::runtime {
namespace {

float logit_of(double lambda) { return static_cast<float>(std::log(lambda / (1 - lambda))); }

TEST(GateTracker, DistributionSumsToOneAndLastStepTakesTheRest) {
  const std::vector<double> lambdas = {0.2, 0.5, 0.25};  // steps 1..3 of 4
  GateTracker g;
  std::vector<float> p;  // [4]
  for (double l : lambdas) p.push_back(g.observe(logit_of(l), 4));
  p.push_back(g.observe(123.0f, 4));  // the last step ignores its own gate
  EXPECT_NEAR(p[0], 0.2, 1e-6);
  EXPECT_NEAR(p[1], 0.5 * 0.8, 1e-6);
  EXPECT_NEAR(p[2], 0.25 * 0.8 * 0.5, 1e-6);
  EXPECT_NEAR(p[3], 0.75 * 0.8 * 0.5, 1e-6);
  EXPECT_NEAR(g.cdf(), 1.0, 1e-6);
  EXPECT_EQ(g.steps(), 4);
}

TEST(GateTracker, ThresholdFiresAtTheFirstStepWhoseCdfReachesIt) {
  GateExitParams q;
  q.mode = ExitGateMode::Threshold;
  q.threshold = 0.55;
  GateTracker g;
  g.observe(logit_of(0.3), 4);  // cdf 0.3
  EXPECT_FALSE(g.exits_now(q, 4));
  g.observe(logit_of(0.5), 4);  // cdf 0.3 + 0.35 = 0.65
  EXPECT_TRUE(g.exits_now(q, 4));
  // >=, not >: a CDF equal to the threshold exits (float32 as torch compares).
  GateExitParams half = q;
  half.threshold = 0.5;
  GateTracker h;
  h.observe(0.0f, 4);  // lambda = 0.5 exactly
  EXPECT_TRUE(h.exits_now(half, 4));
}

TEST(GateTracker, ThresholdOneOnlyAtTheLastStepUnlessTheGateSaturates) {
  GateExitParams q;
  q.mode = ExitGateMode::Threshold;
  q.threshold = 1.0;
  GateTracker g;
  g.observe(5.0f, 3);
  g.observe(5.0f, 3);
  EXPECT_FALSE(g.exits_now(q, 3));
  g.observe(-5.0f, 3);
  EXPECT_TRUE(g.exits_now(q, 3));  // the last step always exits
  // In float32, as in the float32 reference, a saturated gate leaves no mass behind.
  GateTracker s;
  s.observe(40.0f, 3);
  EXPECT_TRUE(s.exits_now(q, 3));
}

TEST(GateTracker, StepModeExitsAtTheStepOrTheLast) {
  GateExitParams st;
  st.mode = ExitGateMode::Step;
  st.step = 2;
  GateTracker g;
  g.observe(-9.0f, 4);
  EXPECT_FALSE(g.exits_now(st, 4));
  g.observe(-9.0f, 4);
  EXPECT_TRUE(g.exits_now(st, 4));
  st.step = 7;  // beyond the loops: the last one
  GateTracker h;
  for (int i = 0; i < 3; ++i) {
    h.observe(0.0f, 4);
    EXPECT_FALSE(h.exits_now(st, 4));
  }
  h.observe(0.0f, 4);
  EXPECT_TRUE(h.exits_now(st, 4));
}

TEST(ResolveGate, KwargsOverTheFileAndTheirErrors) {
  ModelConfig c;
  c.exit_gate = true;
  c.exit_gate_mode = ExitGateMode::Threshold;
  c.exit_gate_threshold = 0.8;
  const EarlyExitParams none;
  GateExitParams g = resolve_gate(c, {}, none);
  EXPECT_EQ(g.mode, ExitGateMode::Threshold);
  EXPECT_DOUBLE_EQ(g.threshold, 0.8);
  GateExitRequest r;
  r.threshold = 0.3;
  EXPECT_DOUBLE_EQ(resolve_gate(c, r, none).threshold, 0.3);
  r.threshold = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(resolve_gate(c, r, none), std::invalid_argument);
  GateExitRequest step;
  step.mode = ExitGateMode::Step;
  EXPECT_THROW(resolve_gate(c, step, none), std::invalid_argument);  // no step anywhere
  step.step = 2;
  EXPECT_EQ(resolve_gate(c, step, none).step, 2);
  // The file's gate yields to an explicit early exit; an explicit gate conflicts with it.
  EarlyExitParams ee;
  ee.patience = 1;
  EXPECT_FALSE(resolve_gate(c, {}, ee).enabled());
  EXPECT_THROW(resolve_gate(c, step, ee), std::invalid_argument);
  // No gate in the model: only exit_gate="off" is accepted.
  ModelConfig plain;
  GateExitRequest off;
  off.mode = ExitGateMode::Off;
  EXPECT_FALSE(resolve_gate(plain, off, none).enabled());
  EXPECT_THROW(resolve_gate(plain, step, none), std::invalid_argument);
  EXPECT_THROW(parse_gate_mode("sometimes"), std::invalid_argument);
  EXPECT_EQ(parse_gate_mode("weighted"), ExitGateMode::Weighted);
}

}  // namespace
}  // namespace tinyloop::runtime
