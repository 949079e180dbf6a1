"""tune: decide the engine setting from one metrics window (pure; consults the twin).

Imports only ``slipstream.api`` and ``slipstream.sim``; no I/O, no clock of its own (every
time is passed in). Modules, in the order a decision flows:

- ``heterogeneity``: ``heterogeneity(hist, profile, C) -> float`` in [0, 1] (NaN without
  traffic): 1 - E[S]^2/E[S^2] of the window's prefill costs, from
  ``sglang:uncached_prompt_tokens_histogram``. Shown in status and the printer column.
- ``candidates``: ``TuningSpec`` (C, page, min/max concurrency, per-tenant p99 TTFT
  targets; ``from_spec(ServingDeploymentSpec)`` builds it), ``enumerate_candidates``,
  ``concurrency(setting, C)``. A setting is ``sim.policies.Setting(threshold, mode, order)``.
- ``twin_workload.synthesize(snapshot, max_requests, seed) -> sim Workload``.
- ``recommend.recommend(snapshot, current, spec, profile, config=None, settings=None)
  -> Ranking``: ``best``, ``current`` and every candidate's ``Prediction``
  (per-tenant p99 TTFT and slowdown, worst-tenant figures, the longest prompts' slowdown,
  ``allowed``/``meets_targets``/``within_long_bound``), ``heterogeneity``, ``feasible``,
  ``gain`` (confirming sample), ``screen_gain`` (screening sample, same two settings) and
  ``gain_spread`` (their disagreement: the noise estimate) and a one-line ``reason``; ``recommend.describe(setting, C)`` and
  ``recommend.policy_name(setting)`` format a setting. Raises ValueError on an invalid or
  empty snapshot (``gate`` catches those first).
- ``guardrails``: ``GuardrailSettings`` (min samples, gain margins, ``noise_factor`` x
  ``gain_spread``, cooldown, interval, ``dwell_cooldowns``), ``TunerState(current,
  last_step_at, rollout_in_progress, left)`` (``left``: settings stepped away from and when;
  ``state.stepped(to, now, keep_s)`` records a step), ``gate(snapshot, state,
  settings, now) -> Hold | None`` (checks needing no twin run) and ``decide(snapshot,
  recommendation, state, spec, settings, now) -> Move | Hold | Infeasible``. Every
  decision has ``kind``; Move has ``from_``, ``to``, ``reason``; Hold and Infeasible have
  ``reason`` (a condition word: RolloutInProgress, NoTraffic, StaleMetrics,
  PrometheusUnreachable, NotFinite, NoSeries, TooFewSamples, Interval, Cooldown,
  OutOfBounds, AtBest, BelowMargin, Dwell, Infeasible) and ``message``; all but gate-level Holds
  carry the ``recommendation`` for status.
- ``tuner.tune_once(snapshot, state, TunerSettings(spec, guardrails, recommender),
  profile, config, now, memo=None) -> Decision``: the one call per interval. The operator
  calls its two halves apart: ``without_twin`` (the gate, or a ``memo`` run reused for an
  unmoved workload; None when the twin must run) on its event loop, and ``with_twin`` (the
  twin run, stored in the memo) on its tuner pool; together they decide as ``tune_once``.
  On Move the caller (rollout) starts the canary of ``decision.to`` and, once it is under
  way, passes ``TunerState(to-or-current, last_step_at=now, rollout_in_progress=True)``
  next time (with ``left`` kept, else the dwell has no memory: the operator keeps it in
  ``status.leftSettings``, written on promotion by ``deployment.record_left`` and read back
  by ``deployment.left_of``); the Event text is ``decision.reason``.
- ``deployment``: the operator's entry point. ``decide_for(sd, snapshot, fleet, now,
  profile, time_scale=1.0) -> Decision`` reads the spec (bounds, targets, interval,
  cooldown) and the status (``lastDecision.time`` starts the cooldown, ``rollout.phase``
  not Idle holds, ``leftSettings`` feeds the dwell), so the tuner keeps no memory of its
  own; ``summary(decision, fleet) -> (EngineSetting, move, reason, heterogeneity)`` is
  what ``controller.tuning.Recommendation`` carries. ``engine_config(spec, pools)`` is the twin's engine: the spec's C and page
  size, and the KV pool of ``twin_pool(snapshot.kv_pools)`` (the smallest pool the pods
  report, else the profile's, with a note saying why).
- ``observed.snapshot_of(deployment, first_tokens, now_s, window_s)``: the snapshot the
  twin's ``auto`` builds from first tokens (SGLang's buckets, ``api.buckets``).
- ``auto.TwinAuto``: the same ``tune_once`` as the twin's controller (``slipstream
  simulate/bench --policy auto``).
- ``codec``: snapshot <-> JSON-able dict (``slipstream recommend --snapshot FILE.json``).

How long: one recommendation (the burst fit, the screen on 200 synthetic requests, 7-9
confirmed on 2000, decodes included) takes 0.49 s of CPU from off (9 candidates within a
step), 0.66 s from concurrency 2 (21), about 1.1 s with all 45 in reach
(``slipstream recommend --snapshot FILE.json [--current POLICY] --time``).
"""
