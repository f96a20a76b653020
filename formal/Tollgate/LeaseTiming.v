(* ========================================================================= *)
(* Tollgate.LeaseTiming : a machine-checked model of Tollgate's lease timing *)
(* ========================================================================= *)
(*
   WHAT IS PROVEN (all over unbounded integers, Coq's Z):

   1. Integer-pair encoding of a nanosecond instant n as
        (floor_us, submicro_ns) = (Z.div n 1000, Z.modulo n 1000)
      (floor division, so negative instants are handled too):
        - decode (encode n) = n for every n               [encode_decode_roundtrip]
        - encode (decode (f, s)) = (f, s) if 0 <= s <= 999 [decode_encode_roundtrip]
        - 0 <= submicro_ns <= 999                          [submicro_range]
        - lexicographic pair order equals nanosecond order,
          both non-strict and strict                       [pair_order_iff,
                                                            pair_order_strict_iff]
   2. Exact cutoff equivalence: for in-domain expiry e and now n and a
      nonnegative grace g, "e + g <= n" holds exactly when the cutoff
      n - g is representable and e <= cutoff             [cutoff_equivalence,
                                                          reclaimable_iff_cutoff];
      the cutoff is undefined exactly on underflow       [cutoff_undefined_iff_underflow].
   3. Overflow safety: if e + g lies beyond ts_max_ns then no representable
      "now" ever makes the lease reclaimable, in either formulation
                                                          [overflow_never_elapsed,
                                                           overflow_cutoff_never_elapsed].
   4. Conservative legacy bounds for instants stored truncated toward zero
      to microseconds (u = Z.quot t 1000), rounded up to
        b(u) = 1000*u + 999 if u >= 0, else 1000*u:
        - t <= b(u)                                       [legacy_bound_upper]
        - b(u) - t <= 999 when u <> 0                     [legacy_bound_tight]
        - b(u) - t <= 1998 when u = 0                     [legacy_bound_tight_zero]
        - b(u) >= 1000*u                                  [legacy_bound_not_earlier]
        - hence deciding reclaimability with b(u) in place of t never
          reclaims earlier than the exact rule            [legacy_reclaim_conservative].

   MODELLING CHOICES / PRECONDITIONS:
   - Instants are integer nanoseconds since the Unix epoch; arithmetic is
     exact (no machine overflow in the model).
   - Valid inputs: timestamps inside jiff 1.0's Timestamp domain
     [ts_min_ns, ts_max_ns] where stated, and a nonnegative grace period.
   - Nothing beyond Coq's standard library is relied upon; check.sh verifies
     with Print Assumptions that every main theorem is closed.

   WHAT IS NOT COVERED:
   - The sqlx / PostgreSQL driver (encoding of values on the wire, type
     conversions performed by the driver or server).
   - PostgreSQL transaction isolation, locking, or concurrency behaviour.
   - Accuracy, monotonicity, or synchronisation of any clock.
   - That the Rust implementation refines this model; that link must be
     established separately (e.g. by tests against these definitions).
*)

From Coq Require Import ZArith Lia.
Open Scope Z_scope.

(* ------------------------------------------------------------------------- *)
(* Domain constants: jiff 1.0 Timestamp range, in nanoseconds since epoch.    *)
(* ------------------------------------------------------------------------- *)

Definition ts_min_ns : Z := -377705023201000000000.
Definition ts_max_ns : Z := 253402207200999999999.

Definition in_domain (t : Z) : Prop := ts_min_ns <= t <= ts_max_ns.

Lemma domain_sane : ts_min_ns < 0 < ts_max_ns.
Proof. unfold ts_min_ns, ts_max_ns; lia. Qed.

(* ------------------------------------------------------------------------- *)
(* 1. Integer-pair encoding                                                  *)
(* ------------------------------------------------------------------------- *)

Definition encode (n : Z) : Z * Z := (n / 1000, n mod 1000).

Definition decode (p : Z * Z) : Z := 1000 * fst p + snd p.

Definition pair_le (p q : Z * Z) : Prop :=
  fst p < fst q \/ (fst p = fst q /\ snd p <= snd q).

Definition pair_lt (p q : Z * Z) : Prop :=
  fst p < fst q \/ (fst p = fst q /\ snd p < snd q).

Theorem encode_decode_roundtrip : forall n : Z, decode (encode n) = n.
Proof.
  intro n; unfold decode, encode; cbn [fst snd].
  pose proof (Z.div_mod n 1000 ltac:(lia)); lia.
Qed.

Theorem submicro_range : forall n : Z, 0 <= snd (encode n) <= 999.
Proof.
  intro n; unfold encode; cbn [fst snd].
  pose proof (Z.mod_pos_bound n 1000 ltac:(lia)); lia.
Qed.

Theorem decode_encode_roundtrip :
  forall f s : Z, 0 <= s <= 999 -> encode (decode (f, s)) = (f, s).
Proof.
  intros f s Hs; unfold encode, decode; cbn [fst snd].
  f_equal.
  - symmetry; apply Z.div_unique with (r := s); lia.
  - symmetry; apply Z.mod_unique with (q := f); lia.
Qed.

Lemma encode_injective : forall n m : Z, encode n = encode m -> n = m.
Proof.
  intros n m H.
  rewrite <- (encode_decode_roundtrip n), <- (encode_decode_roundtrip m), H.
  reflexivity.
Qed.

Theorem pair_order_iff :
  forall n m : Z, n <= m <-> pair_le (encode n) (encode m).
Proof.
  intros n m; unfold pair_le, encode; cbn [fst snd].
  pose proof (Z.div_mod n 1000 ltac:(lia)).
  pose proof (Z.div_mod m 1000 ltac:(lia)).
  pose proof (Z.mod_pos_bound n 1000 ltac:(lia)).
  pose proof (Z.mod_pos_bound m 1000 ltac:(lia)).
  split.
  - intro Hle.
    destruct (Z.lt_trichotomy (n / 1000) (m / 1000)) as [Hlt | [Heq | Hgt]].
    + left; exact Hlt.
    + right; split; [exact Heq | lia].
    + exfalso; nia.
  - intros [Hlt | [Heq Hs]]; nia.
Qed.

Theorem pair_order_strict_iff :
  forall n m : Z, n < m <-> pair_lt (encode n) (encode m).
Proof.
  intros n m; unfold pair_lt, encode; cbn [fst snd].
  pose proof (Z.div_mod n 1000 ltac:(lia)).
  pose proof (Z.div_mod m 1000 ltac:(lia)).
  pose proof (Z.mod_pos_bound n 1000 ltac:(lia)).
  pose proof (Z.mod_pos_bound m 1000 ltac:(lia)).
  split.
  - intro Hlt.
    destruct (Z.lt_trichotomy (n / 1000) (m / 1000)) as [Hl | [Heq | Hgt]].
    + left; exact Hl.
    + right; split; [exact Heq | lia].
    + exfalso; nia.
  - intros [Hl | [Heq Hs]]; nia.
Qed.

(* ------------------------------------------------------------------------- *)
(* 2. Exact cutoff equivalence                                               *)
(* ------------------------------------------------------------------------- *)

(* A lease with expiry e and grace g is reclaimable at instant n. *)
Definition reclaimable (e g n : Z) : Prop := e + g <= n.

(* The cutoff instant n - g, if it is representable. *)
Definition cutoff (n g : Z) : option Z :=
  if n - g <? ts_min_ns then None else Some (n - g).

Theorem cutoff_equivalence :
  forall e g n : Z,
    ts_min_ns <= e <= ts_max_ns ->
    ts_min_ns <= n <= ts_max_ns ->
    0 <= g ->
    (e + g <= n <-> exists c, cutoff n g = Some c /\ e <= c).
Proof.
  intros e g n He Hn Hg; unfold cutoff.
  destruct (Z.ltb_spec (n - g) ts_min_ns) as [Hlt | Hge].
  - split.
    + intro H; exfalso; lia.
    + intros [c [Hc _]]; discriminate Hc.
  - split.
    + intro H; exists (n - g); split; [reflexivity | lia].
    + intros [c [Hc Hec]]; injection Hc as <-; lia.
Qed.

Theorem reclaimable_iff_cutoff :
  forall e g n : Z,
    in_domain e -> in_domain n -> 0 <= g ->
    (reclaimable e g n <-> exists c, cutoff n g = Some c /\ e <= c).
Proof.
  intros e g n He Hn Hg; unfold reclaimable.
  apply cutoff_equivalence; assumption.
Qed.

Theorem cutoff_undefined_iff_underflow :
  forall n g : Z, cutoff n g = None <-> n - g < ts_min_ns.
Proof.
  intros n g; unfold cutoff.
  destruct (Z.ltb_spec (n - g) ts_min_ns) as [Hlt | Hge].
  - split; [intros _; exact Hlt | intros _; reflexivity].
  - split; [intro H; discriminate H | intro H; exfalso; lia].
Qed.

(* On underflow no in-domain expiry is due. *)
Theorem underflow_nothing_due :
  forall e g n : Z,
    in_domain e -> cutoff n g = None -> ~ reclaimable e g n.
Proof.
  intros e g n He Hc; unfold reclaimable, in_domain in *.
  apply cutoff_undefined_iff_underflow in Hc; lia.
Qed.

(* ------------------------------------------------------------------------- *)
(* 3. Overflow safety                                                        *)
(* ------------------------------------------------------------------------- *)

Theorem overflow_never_elapsed :
  forall e g n : Z,
    e + g > ts_max_ns -> n <= ts_max_ns -> ~ (e + g <= n).
Proof. intros; lia. Qed.

Theorem overflow_cutoff_never_elapsed :
  forall e g n : Z,
    e + g > ts_max_ns -> n <= ts_max_ns ->
    forall c : Z, cutoff n g = Some c -> ~ (e <= c).
Proof.
  intros e g n Hov Hn c Hc; unfold cutoff in Hc.
  destruct (Z.ltb_spec (n - g) ts_min_ns).
  - discriminate Hc.
  - injection Hc as <-; lia.
Qed.

(* ------------------------------------------------------------------------- *)
(* 4. Conservative legacy bounds (microsecond truncation toward zero)        *)
(* ------------------------------------------------------------------------- *)

Definition legacy_us (t : Z) : Z := Z.quot t 1000.

Definition legacy_bound (u : Z) : Z :=
  if u >=? 0 then 1000 * u + 999 else 1000 * u.

(* Facts about truncating division by 1000, stated without Z.quot. *)
Lemma quot_facts :
  forall t : Z,
    (0 <= t -> 1000 * Z.quot t 1000 <= t <= 1000 * Z.quot t 1000 + 999) /\
    (t <= 0 -> 1000 * Z.quot t 1000 - 999 <= t <= 1000 * Z.quot t 1000) /\
    (0 <= t -> 0 <= Z.quot t 1000) /\
    (t <= 0 -> Z.quot t 1000 <= 0).
Proof.
  intro t.
  pose proof (Z.quot_rem' t 1000) as Hqr.
  pose proof (Z.rem_bound_abs t 1000 ltac:(lia)) as Hb.
  pose proof (Z.rem_nonneg t 1000) as Hnn.
  pose proof (Z.rem_nonpos t 1000) as Hnp.
  pose proof (Z.quot_pos t 1000) as Hqp.
  assert (Hqn : t <= 0 -> Z.quot t 1000 <= 0).
  { intro Ht. rewrite <- (Z.opp_involutive t), Z.quot_opp_l by lia.
    pose proof (Z.quot_pos (- t) 1000 ltac:(lia) ltac:(lia)); lia. }
  repeat split; intros; try lia;
    try (specialize (Hnn ltac:(lia) ltac:(lia)); lia);
    try (specialize (Hnp ltac:(lia) ltac:(lia)); lia);
    try (apply Hqp; lia);
    try (apply Hqn; lia).
Qed.

Theorem legacy_bound_upper :
  forall t : Z, t <= legacy_bound (legacy_us t).
Proof.
  intro t; unfold legacy_bound, legacy_us.
  destruct (quot_facts t) as (H1 & H2 & H3 & H4).
  destruct (Z.geb_spec (Z.quot t 1000) 0); destruct (Z.le_ge_cases 0 t); lia.
Qed.

Theorem legacy_bound_tight :
  forall t : Z, legacy_us t <> 0 -> legacy_bound (legacy_us t) - t <= 999.
Proof.
  intros t Hu; unfold legacy_bound, legacy_us in *.
  destruct (quot_facts t) as (H1 & H2 & H3 & H4).
  destruct (Z.geb_spec (Z.quot t 1000) 0); destruct (Z.le_ge_cases 0 t); lia.
Qed.

Theorem legacy_bound_tight_zero :
  forall t : Z, legacy_us t = 0 -> legacy_bound (legacy_us t) - t <= 1998.
Proof.
  intros t Hu; unfold legacy_bound, legacy_us in *.
  destruct (quot_facts t) as (H1 & H2 & H3 & H4).
  destruct (Z.geb_spec (Z.quot t 1000) 0); destruct (Z.le_ge_cases 0 t); lia.
Qed.

Theorem legacy_bound_not_earlier :
  forall u : Z, legacy_bound u >= 1000 * u.
Proof.
  intro u; unfold legacy_bound.
  destruct (Z.geb_spec u 0); lia.
Qed.

(* Using the rounded-up bound instead of the true instant never reclaims a
   lease earlier than the exact rule would. *)
Theorem legacy_reclaim_conservative :
  forall t g n : Z,
    reclaimable (legacy_bound (legacy_us t)) g n -> reclaimable t g n.
Proof.
  intros t g n H; unfold reclaimable in *.
  pose proof (legacy_bound_upper t); lia.
Qed.
