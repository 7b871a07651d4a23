use super::act::ActPrecision;
use super::*;
use model_loader::quant::quantize;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn qmatrix(ty: QuantType, n: usize, k: usize, rng: &mut ChaCha8Rng) -> QMatrix {
    let w: Vec<f32> = (0..n * k)
        .map(|i| rng.gen_range(-1.0..1.0) * (0.2 + (i / 32 % 5) as f32 * 0.2) + 0.05)
        .collect();
    QMatrix {
        ty,
        rows: n,
        cols: k,
        bytes: quantize(ty, &w).expect("whole blocks"),
    }
}

/// f64 `x W^T` on the dequantized weights and the dequantized activations:
/// the kernels must match it up to f32 summation rounding.
fn reference(act: &QuantizedActs, w: &QMatrix) -> Vec<f64> {
    let wf = w.to_f32();
    let (m, n, k) = (act.m, w.rows, w.cols);
    let mut out = vec![0f64; m * n];
    for r in 0..m {
        for c in 0..n {
            out[r * n + c] = (0..k)
                .map(|i| {
                    let x = act.value(r, i);
                    x * f64::from(wf[c * k + i])
                })
                .sum();
        }
    }
    out
}

/// Every type through `isa`'s kernels (direct, row-major tiles and lane
/// groups, by the row counts; 37 and 44 rows end in a lane group padded
/// on AVX2 and AVX-512 respectively, 19 in row-major rows) against the
/// f64 product, on odd shapes.
fn every_type_matches_f64_on_odd_shapes(isa: Isa) {
    assert!(
        Isa::available().contains(&isa),
        "{isa:?}: this CPU's families are {:?}",
        Isa::available()
    );
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for ty in QuantType::ALL {
        let kb = ty.block_len();
        for &(m, n, k) in &[
            (1, 1, kb),
            (3, 7, 3 * kb),
            (5, 13, 2 * kb),
            (8, 5, kb),
            (19, 6, 2 * kb),
            (32, 9, kb),
            (37, 5, 2 * kb),
            (44, 7, kb),
        ] {
            let w = qmatrix(ty, n, k, &mut rng);
            let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
            for p in [ActPrecision::One8, ActPrecision::Two8] {
                let act = QuantizedActs::with_precision(&x, m, k, p);
                let want = reference(&act, &w);
                let mut out = vec![f32::NAN; m * n];
                matmul(&act, &w, &mut out, n, false, isa);
                for (i, (g, e)) in out.iter().zip(&want).enumerate() {
                    let tol = 1e-4 * (1.0 + e.abs()) * (k as f64).sqrt();
                    assert!(
                        (f64::from(*g) - e).abs() <= tol,
                        "{} {isa:?} {p:?} {m}x{n}x{k} [{i}]: {g} vs {e}",
                        ty.name()
                    );
                }
            }
        }
    }
}

// One test per kernel family, so the test output says which ran: a family
// the build machine's CPU lacks shows as ignored, with the reason
// (`engine/build.rs`).

#[test]
fn scalar_kernels_match_f64_for_every_type() {
    every_type_matches_f64_on_odd_shapes(Isa::Scalar);
}

#[test]
#[cfg_attr(
    not(host_avx2),
    ignore = "this CPU lacks AVX2 + FMA: the AVX2 kernels did not run"
)]
fn avx2_kernels_match_f64_for_every_type() {
    every_type_matches_f64_on_odd_shapes(Isa::Avx2);
}

#[test]
#[cfg_attr(
    not(host_avx512_vnni),
    ignore = "this CPU lacks AVX-512 F/BW/VL/VNNI: the 512-bit kernels did not run"
)]
fn avx512_kernels_match_f64_for_every_type() {
    every_type_matches_f64_on_odd_shapes(Isa::Avx512Vnni);
}

/// The NEON block against f64, and bit for bit against the portable
/// kernel whose float operations it repeats.
#[test]
#[cfg_attr(
    not(target_arch = "aarch64"),
    ignore = "not an aarch64 build: the NEON kernels did not run"
)]
fn neon_kernels_match_f64_and_the_portable_bits_for_every_type() {
    every_type_matches_f64_on_odd_shapes(Isa::Neon);
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    for ty in QuantType::ALL {
        let (m, n, k) = (7, 9, 2 * ty.block_len().max(64));
        let w = qmatrix(ty, n, k, &mut rng);
        let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
        for p in [ActPrecision::One8, ActPrecision::Two8] {
            let act = QuantizedActs::with_precision(&x, m, k, p);
            let run = |isa| {
                let mut out = vec![f32::NAN; m * n];
                matmul(&act, &w, &mut out, n, false, isa);
                out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            assert_eq!(run(Isa::Neon), run(Isa::Scalar), "{} {p:?}", ty.name());
        }
    }
}

#[test]
fn strided_output_and_accumulate() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let (m, n, k, ldo) = (3, 6, 64, 10);
    let w = qmatrix(QuantType::Q4_1, n, k, &mut rng);
    let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let act = QuantizedActs::new(&x, m, k);
    let want = reference(&act, &w);
    let mut out = vec![1.5f32; m * ldo];
    matmul(&act, &w, &mut out[2..], ldo, true, Isa::best());
    for r in 0..m {
        for c in 0..ldo {
            let v = f64::from(out[r * ldo + c]);
            if (2..2 + n).contains(&c) {
                let e = want[r * n + c - 2] + 1.5;
                assert!((v - e).abs() < 1e-3, "[{r},{c}] {v} vs {e}");
            } else {
                assert_eq!(v, 1.5, "column {c} outside the output was written");
            }
        }
    }
}

#[test]
fn quantized_product_is_close_to_the_f32_product() {
    // End to end against unquantized activations: the error is the
    // activation quantization's (Q8_0: well under 1% of the row norm).
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (m, n, k) = (4, 16, 512);
    let w = qmatrix(QuantType::Q4K, n, k, &mut rng);
    let wf = w.to_f32();
    let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut out = vec![0f32; m * n];
    matmul(
        &QuantizedActs::new(&x, m, k),
        &w,
        &mut out,
        n,
        false,
        Isa::best(),
    );
    for r in 0..m {
        for c in 0..n {
            let e: f64 = (0..k)
                .map(|i| f64::from(x[r * k + i]) * f64::from(wf[c * k + i]))
                .sum();
            let norm: f64 = (0..k)
                .map(|i| f64::from(wf[c * k + i]).powi(2))
                .sum::<f64>()
                .sqrt();
            assert!((f64::from(out[r * n + c]) - e).abs() < 0.01 * norm * (k as f64).sqrt() / 8.0);
        }
    }
}

#[test]
fn tile_decode_equals_the_generic_decoders_for_every_type() {
    // The fast decoders (tile_decode) and the generic path must give the
    // same bits; and the tile's form must give back model-loader's
    // dequantization (`a * (u - 128)` for the signed types, whose 128 the
    // kernels take out, else `a * u + bb`).
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    for ty in QuantType::ALL {
        let k = 3 * ty.block_len();
        let w = qmatrix(ty, NR, k, &mut rng);
        let mut tile = Tile::new(ty, k);
        tile.decode(&w, 0, NR);
        let wf = w.to_f32();
        let rb = w.row_bytes();
        for t in 0..NR {
            let (u, a8, bb) = tile.row(t);
            let (gu, ga, gb) = tile::decode_row_generic(ty, &w.bytes[t * rb..(t + 1) * rb], k);
            assert_eq!(u, &gu[..], "{} row {t}: levels", ty.name());
            assert_eq!(a8, &ga[..], "{} row {t}: scales", ty.name());
            assert_eq!(bb, &gb[..], "{} row {t}: offsets", ty.name());
            for i in 0..k {
                let a = f64::from(a8[i / 32 * 8 + (i % 32) / 16 * 4]);
                let v = if tile.signed {
                    a * (f64::from(u[i]) - 128.0)
                } else {
                    a * f64::from(u[i]) + f64::from(bb[i / 16])
                };
                let e = f64::from(wf[t * k + i]);
                assert!(
                    (v - e).abs() <= 1e-6 * (1.0 + e.abs()),
                    "{} row {t} [{i}]: {v} vs {e}",
                    ty.name()
                );
            }
        }
    }
}

#[test]
fn register_blocks_match_f64_on_row_and_column_tails() {
    // Row counts covering every row-block remainder (MR = 4); n = 7
    // leaves a partial weight tile; k = 3 blocks of 32 ends on a half
    // 512-bit step. Both activation precisions, every kernel family.
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    for ty in QuantType::ALL {
        let k = if ty.block_len() == 256 { 256 } else { 96 };
        let n = 7;
        let w = qmatrix(ty, n, k, &mut rng);
        // From the first m past the one-row kernels to past the many-row
        // ones (AVX-512), so every family reaches its tiles' row tails.
        for m in GEMV_MAX_M + 1..=MANY_MAX_M + 2 * MR + 1 {
            let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
            for p in [ActPrecision::One8, ActPrecision::Two8] {
                let act = QuantizedActs::with_precision(&x, m, k, p);
                let want = reference(&act, &w);
                for isa in Isa::available() {
                    let mut out = vec![f32::NAN; m * n];
                    matmul(&act, &w, &mut out, n, false, isa);
                    for (i, (g, e)) in out.iter().zip(&want).enumerate() {
                        let tol = 1e-4 * (1.0 + e.abs()) * (k as f64).sqrt();
                        assert!(
                            (f64::from(*g) - e).abs() <= tol,
                            "{} {isa:?} {p:?} m={m} [{i}]: {g} vs {e}",
                            ty.name()
                        );
                    }
                }
            }
        }
    }
}

/// Says in the test output whether `what`'s AVX-VNNI form ran (and was
/// compared with the plain form): on a CPU without AVX-VNNI the tests'
/// with/without comparisons compare the plain form with itself.
fn say_whether_avx_vnni_ran(what: &str) {
    #[cfg(target_arch = "x86_64")]
    let ran = super::kernels::has_avx_vnni();
    #[cfg(not(target_arch = "x86_64"))]
    let ran = false;
    if ran {
        eprintln!("{what}: AVX-VNNI form ran (compared with the plain form)");
    } else {
        eprintln!("{what}: AVX-VNNI form not run (this CPU lacks it)");
    }
}

#[test]
fn direct_few_row_path_matches_f64_across_stripes_and_tails() {
    say_whether_avx_vnni_ran("AVX2 one-row and many-row kernels");
    // n = 130: two thread stripes, each ending in a partial group of rows.
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let n = 130;
    for ty in [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::Q5K,
        QuantType::Q6K,
    ] {
        let k = if ty.block_len() == 256 { 768 } else { 576 };
        let w = qmatrix(ty, n, k, &mut rng);
        for m in 1..=MANY_MAX_M + 1 {
            let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let p = if m % 2 == 0 {
                ActPrecision::One8
            } else {
                ActPrecision::Two8
            };
            let act = QuantizedActs::with_precision(&x, m, k, p);
            let want = reference(&act, &w);
            for isa in Isa::available() {
                let mut res = [f32::NAN; NR];
                let direct = gemv::dot_rows(isa, &w, n - 2, 2, &act, m - 1, &mut res);
                assert_eq!(direct, gemv::supported(isa, ty), "{isa:?}");
                // The many-row kernels: each row the one-row kernel's bits.
                if let Some(many) = gemv::ManyRows::new(isa, ty, &act) {
                    let mut all = [[f32::NAN; NR]; MANY_MAX_M];
                    gemv::dot_rows_many(&w, n - 3, 3, &many, &mut all);
                    // The AVX2 many-row kernels' plain form: the AVX-VNNI
                    // form's bits (where the CPU has it, `all` took it).
                    #[cfg(target_arch = "x86_64")]
                    if isa == Isa::Avx2 {
                        let mut plain = [[f32::NAN; NR]; MANY_MAX_M];
                        super::kernels::without_avx_vnni(|| {
                            let many = gemv::ManyRows::new(isa, ty, &act).expect("built above");
                            gemv::dot_rows_many(&w, n - 3, 3, &many, &mut plain)
                        });
                        let bits = |v: &[[f32; NR]]| -> Vec<u32> {
                            v.iter()
                                .flat_map(|r| r[..3].iter().map(|x| x.to_bits()))
                                .collect()
                        };
                        assert_eq!(
                            bits(&plain[..m]),
                            bits(&all[..m]),
                            "{} {p:?} m={m}: AVX2 many-row kernels with and without AVX-VNNI",
                            ty.name()
                        );
                    }
                    for (r, got) in all.iter().enumerate().take(m) {
                        let mut one = [f32::NAN; NR];
                        gemv::dot_rows(isa, &w, n - 3, 3, &act, r, &mut one);
                        assert!(
                            got[..3]
                                .iter()
                                .zip(&one)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{} {isa:?} {p:?} m={m} row {r}: {:?} vs {:?}",
                            ty.name(),
                            &got[..3],
                            &one[..3]
                        );
                    }
                }
                if direct {
                    for t in 0..2 {
                        let e = want[(m - 1) * n + n - 2 + t];
                        assert!((f64::from(res[t]) - e).abs() <= 1e-3 * (1.0 + e.abs()));
                    }
                }
                // The AVX2 kernels' plain form: the AVX-VNNI form's bits
                // (where the CPU has it, `dot_rows` took that form).
                #[cfg(target_arch = "x86_64")]
                if direct && isa == Isa::Avx2 {
                    let mut plain = [f32::NAN; NR];
                    super::kernels::without_avx_vnni(|| {
                        gemv::dot_rows(isa, &w, n - 2, 2, &act, m - 1, &mut plain)
                    });
                    assert_eq!(
                        plain.map(f32::to_bits)[..2],
                        res.map(f32::to_bits)[..2],
                        "{} {p:?} m={m}: AVX2 with and without AVX-VNNI",
                        ty.name()
                    );
                }
                let mut out = vec![f32::NAN; m * n];
                matmul(&act, &w, &mut out, n, false, isa);
                for (i, (g, e)) in out.iter().zip(&want).enumerate() {
                    let tol = 1e-4 * (1.0 + e.abs()) * (k as f64).sqrt();
                    assert!(
                        (f64::from(*g) - e).abs() <= tol,
                        "{} {isa:?} m={m} [{i}]: {g} vs {e}",
                        ty.name()
                    );
                }
            }
        }
    }
}

#[test]
fn two_level_activations_are_two_hundred_times_finer() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let (m, k) = (3, 256);
    // Outliers in some blocks, as in real hidden states.
    let x: Vec<f32> = (0..m * k)
        .map(|i| rng.gen_range(-1.0..1.0) * if i % 97 == 0 { 40.0 } else { 1.0 })
        .collect();
    let err = |p| {
        let a = QuantizedActs::with_precision(&x, m, k, p);
        (0..m * k)
            .map(|i| (a.value(i / k, i % k) - f64::from(x[i])).abs())
            .fold(0f64, f64::max)
    };
    let (one, two) = (err(ActPrecision::One8), err(ActPrecision::Two8));
    assert!(
        one > 0.01 && two < one / 200.0,
        "one level {one}, two {two}"
    );
}

#[test]
fn vectorized_activation_quantization_is_bit_identical_to_the_portable_one() {
    // Random values, exact ties (v / d = n + 0.5 with d = 1: amax 127),
    // zeros, tiny and huge magnitudes, and a NaN: the AVX2 and 512-bit
    // forms must give the same bytes and the same f32 bits as the plain
    // build.
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (m, k) = (7, 96);
    let mut x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-3.0..3.0)).collect();
    for (i, v) in x[..64].iter_mut().enumerate() {
        *v = if i % 32 == 0 {
            127.0
        } else {
            (i as f32 - 32.0) + 0.5
        };
    }
    x[64..96].fill(0.0);
    for (i, v) in x[96..160].iter_mut().enumerate() {
        *v = (i as f32 - 30.0) * if i < 32 { 1e-30 } else { 1e30 };
    }
    x[200] = f32::NAN;
    if !super::kernels::has_avx512_bw() {
        eprintln!("SKIP 512-bit activation quantization: this CPU has no AVX-512 F/BW/DQ");
    }
    for (p, wide) in [ActPrecision::One8, ActPrecision::Two8]
        .into_iter()
        .flat_map(|p| [(p, false), (p, true)])
    {
        let a = QuantizedActs::quantize(&x, m, k, p, wide);
        let b = act::portable(&x, m, k, p);
        assert_eq!(a.q, b.q, "{p:?} 512-bit {wide}: levels");
        assert_eq!(a.lo, b.lo, "{p:?} 512-bit {wide}: residual levels");
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.d), bits(&b.d), "{p:?} 512-bit {wide}: scales");
        assert_eq!(bits(&a.sums), bits(&b.sums), "{p:?} 512-bit {wide}: sums");
        // The ties round away from zero (f32::round), as llama.cpp's
        // quantize_row_q8_0 does with roundf.
        assert_eq!(&b.q[1..4], &[-31, -30, -29], "{p:?} ties");
    }
}

#[test]
fn long_prompts_split_into_panels_with_the_same_results() {
    // k = 2048 at two levels: a panel holds fewer than 600 rows with an L2
    // up to 4 MiB, so the rows run as several panels, each re-decoding the
    // tiles.
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (m, n, k) = (600, 6, 2048);
    for align in [MR, super::lanes::LANES, super::lanes::MAX_LANES] {
        let panel = panel_rows(m, k, true, align);
        assert!(
            panel < m && panel.is_multiple_of(align),
            "panel of {panel} rows"
        );
    }
    let w = qmatrix(QuantType::Q4_1, n, k, &mut rng);
    let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let act = QuantizedActs::new(&x, m, k);
    let want = reference(&act, &w);
    for isa in Isa::available() {
        let mut out = vec![f32::NAN; m * n];
        matmul(&act, &w, &mut out, n, false, isa);
        for (i, (g, e)) in out.iter().zip(&want).enumerate() {
            let tol = 1e-4 * (1.0 + e.abs()) * (k as f64).sqrt();
            assert!(
                (f64::from(*g) - e).abs() <= tol,
                "{isa:?} [{i}]: {g} vs {e}"
            );
        }
    }
}

/// The lane kernels (AVX2's groups of 8, AVX-512's groups of 16) give
/// the bits of their portable form, for every type, both activation
/// precisions and both scale granularities; and a row's result is the same
/// bits at either width (so on either instruction set).
#[test]
#[allow(clippy::needless_range_loop)] // g indexes the pair and names the group
fn lane_kernels_match_their_portable_form_bit_for_bit() {
    use super::lanes::{dot_groups, scalar_group, GroupRes, LANES, MAX_LANES};
    say_whether_avx_vnni_ran("AVX2 lane kernel");
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for ty in QuantType::ALL {
        let k = 2 * ty.block_len().max(64);
        let w = qmatrix(ty, NR, k, &mut rng);
        let m = 2 * MAX_LANES + 6;
        let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-3.0..3.0)).collect();
        for p in [ActPrecision::One8, ActPrecision::Two8] {
            let mut tile = Tile::new(ty, k);
            tile.decode(&w, 0, NR);
            tile.widen();
            // Every row's result per width, to compare the widths.
            let mut by_width: Vec<Vec<[f32; NR]>> = Vec::new();
            for width in [LANES, MAX_LANES] {
                let act = QuantizedActs::with_precision(&x, m, k, p).with_lanes(width);
                let la = act.lanes.as_ref().expect("whole groups");
                // m = 38: a last group of 6 rows is padded at width 8
                // (at least half a group), left out at width 16.
                let groups = if width == LANES {
                    m.div_ceil(width)
                } else {
                    m / width
                };
                assert_eq!((la.groups, la.m), (groups, m.min(groups * width)));
                let mut rows = Vec::new();
                for g0 in (0..la.groups).step_by(2) {
                    let n = (la.groups - g0).min(2);
                    let mut pair = [[[0f32; NR]; MAX_LANES]; 2];
                    dot_groups(&tile, la, g0, &mut pair[..n]);
                    for g in g0..g0 + n {
                        let mut one: [GroupRes; 1] = [[[0f32; NR]; MAX_LANES]];
                        let mut slow = vec![[1f32; NR]; width];
                        dot_groups(&tile, la, g, &mut one);
                        scalar_group(&tile, la, g, &mut slow);
                        let name = ty.name();
                        assert_eq!(one[0][..width], slow[..], "{name} {p:?} w{width} group {g}");
                        assert_eq!(
                            pair[g - g0][..width],
                            slow[..],
                            "{name} {p:?} w{width} group {g} of a pair"
                        );
                        // The 8-wide kernel without AVX-VNNI too (where
                        // the CPU has it, `dot_groups` took its form).
                        if width == LANES && super::lanes::avx2_plain(&tile, la, g, &mut one) {
                            assert_eq!(one[0][..width], slow[..], "{name} {p:?} no AVX-VNNI");
                        }
                        rows.extend_from_slice(&slow);
                    }
                }
                by_width.push(rows);
            }
            assert!(
                by_width[0][m..].iter().flatten().all(|&v| v == 0.0),
                "padding"
            );
            let common = by_width[1].len();
            assert_eq!(
                by_width[0][..common],
                by_width[1][..],
                "{} {p:?}: a row's lane result depends on the group width",
                ty.name()
            );
        }
    }
}

/// The one-pass decoders (AVX2 and, where the CPU has it, 512-bit) give
/// the lane kernel the levels and block scales of decode + widen, and zero
/// rows past the decoded count.
#[test]
fn wide_decode_equals_decode_then_widen() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    if !super::kernels::has_avx512_bw() {
        eprintln!("SKIP 512-bit one-pass decoders: this CPU has no AVX-512 F/BW/DQ (AVX2 ran)");
    }
    let modes = [false, super::kernels::has_avx512_bw()];
    for (ty, wide512) in QuantType::ALL
        .into_iter()
        .flat_map(|t| modes.map(|m| (t, m)))
    {
        let k = 2 * ty.block_len().max(64);
        let w = qmatrix(ty, NR, k, &mut rng);
        for nr in [NR, NR - 1] {
            let mut wide = Tile::new(ty, k);
            wide.wide512 = wide512;
            let mut two = Tile::new(ty, k);
            // A tile used for another matrix: nothing stale may show.
            let other = qmatrix(ty, NR, k, &mut rng);
            wide.decode(&other, 0, NR);
            wide.widen();
            if !wide.decode_wide(&w, 0, nr) {
                assert!(
                    matches!(ty, QuantType::Q2K | QuantType::Q3K | QuantType::Q8K),
                    "{} has a wide decoder",
                    ty.name()
                );
                continue;
            }
            two.decode(&w, 0, nr);
            two.widen();
            let name = ty.name();
            assert_eq!(
                wide.w16, two.w16,
                "{name} nr {nr} 512-bit {wide512}: levels"
            );
            assert_eq!(wide.w16_offset, two.w16_offset, "{name}");
            let (kp, gp) = (wide.kp, wide.kp / 16);
            for t in 0..NR {
                for c in 0..k / 32 {
                    let halves: &[usize] = if lanes::half_scales(ty) {
                        &[0, 4]
                    } else {
                        &[0]
                    };
                    for &h in halves {
                        let at = t * kp / 4 + 8 * c + h;
                        assert_eq!(wide.a8[at], two.a8[at], "{name} row {t} block {c} half {h}");
                    }
                }
                if wide.w16_offset {
                    let at = t * gp..t * gp + k / 16;
                    assert_eq!(wide.bb[at.clone()], two.bb[at], "{name} row {t}: offsets");
                }
            }
        }
    }
}

/// A row's result is the same bits whatever the number of rows it is
/// multiplied with (1..=9 and 33: the direct kernels up to
/// [`GEMV_MAX_M`], the tile kernels above, row tails of every register
/// block), for every type, both activation precisions and every ISA this
/// CPU runs, with `invariant` (exact offset forms, no lane kernel).
#[test]
fn rows_are_bit_identical_whatever_the_batch() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let isas = Isa::available();
    let names: Vec<&str> = isas
        .iter()
        .rev()
        .map(|i| match i {
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Avx2 => "avx2",
            Isa::Neon => "neon",
            Isa::Scalar => "portable",
        })
        .collect();
    eprintln!("quant kernels ran on: {}", names.join(", "));
    if !isas.contains(&Isa::Avx512Vnni) {
        eprintln!("quant kernels: this CPU lacks AVX-512 VNNI; its kernels were not run");
    }
    let n = 13;
    for ty in QuantType::ALL {
        let kb = ty.block_len();
        // 32-block types: also k = 32 mod 64 (the 512-bit kernels' half
        // step).
        let ks: &[usize] = if kb == 32 {
            &[23 * 32, 24 * 32]
        } else {
            &[2 * kb, 3 * kb]
        };
        for &k in ks {
            let w = qmatrix(ty, n, k, &mut rng);
            let m_max = 33;
            let x: Vec<f32> = (0..m_max * k)
                .map(|i| rng.gen_range(-2.0..2.0) * if i % 97 == 0 { 8.0 } else { 1.0 })
                .collect();
            for p in [ActPrecision::Two8, ActPrecision::One8] {
                for &isa in &isas {
                    for invariant in [false, true] {
                        let product = |rows: &[f32], m: usize| {
                            let act = quantize_acts(rows, m, k, p, isa, invariant);
                            let mut out = vec![f32::NAN; m * n];
                            matmul_with(&act, &w, &mut out, n, false, isa, invariant);
                            out
                        };
                        let alone: Vec<Vec<f32>> = (0..m_max)
                            .map(|r| product(&x[r * k..(r + 1) * k], 1))
                            .collect();
                        // Without `invariant` only the portable kernels are.
                        if !invariant && isa != Isa::Scalar {
                            continue;
                        }
                        for m in (1..=9).chain([m_max]) {
                            // The batch starts at a different row each time,
                            // so a row sits at several places of the blocks.
                            let r0 = (m * 5) % (m_max - m + 1);
                            let out = product(&x[r0 * k..(r0 + m) * k], m);
                            for r in 0..m {
                                let (got, want) = (&out[r * n..(r + 1) * n], &alone[r0 + r]);
                                let same = got
                                    .iter()
                                    .zip(want)
                                    .all(|(a, b)| a.to_bits() == b.to_bits());
                                assert!(
                                    same,
                                    "{} k {k} {p:?} {isa:?} invariant {invariant}: row {} of {m} \
                                     differs from the row alone:\n{got:?}\n{want:?}",
                                    ty.name(),
                                    r0 + r
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
