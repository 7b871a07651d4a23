//! The host emulator itself: indices over 3-D grids and blocks, barriers with shared
//! memory, warp shuffles, atomics, shared-memory poisoning, panic propagation.

use gpu_kernels::device::emu::launch;
use gpu_kernels::device::*;
use gpu_kernels::{shared_array, Dim3, LaunchConfig};

fn cfg(grid: Dim3, block: Dim3, shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid,
        block,
        shared_mem_bytes: shared,
    }
}

#[test]
fn indices_cover_3d_grid_and_block() {
    let (grid, block) = (Dim3::xyz(2, 3, 2), Dim3::xyz(8, 2, 2));
    let n = grid.count() * block.count();
    let mut out = vec![u32::MAX; n * 2];
    let o = out.as_mut_ptr() as usize;
    // SAFETY: each thread writes its own two slots.
    unsafe {
        launch(cfg(grid, block, 0), || {
            let b = block_idx_x() + grid_dim_x() * (block_idx_y() + grid_dim_y() * block_idx_z());
            let t =
                thread_idx_x() + block_dim_x() * (thread_idx_y() + block_dim_y() * thread_idx_z());
            let g = (b * block_dim_x() * block_dim_y() * block_dim_z() + t) as usize;
            let enc = (block_idx_z() << 24) | (block_idx_y() << 16) | (block_idx_x() << 8) | t;
            *(o as *mut u32).add(2 * g) = enc;
            *(o as *mut u32).add(2 * g + 1) =
                thread_idx_z() * 100 + thread_idx_y() * 10 + thread_idx_x() % 8;
        })
    };
    for g in 0..n {
        let (b, t) = (g / block.count(), g % block.count());
        let (bx, by, bz) = (b % 2, (b / 2) % 3, b / 6);
        assert_eq!(
            out[2 * g],
            ((bz << 24) | (by << 16) | (bx << 8) | t) as u32,
            "global thread {g}"
        );
        let (tx, ty, tz) = (t % 8, (t / 8) % 2, t / 16);
        assert_eq!(
            out[2 * g + 1],
            (tz * 100 + ty * 10 + tx) as u32,
            "global thread {g}"
        );
    }
}

#[test]
fn barrier_orders_static_and_dynamic_shared_memory() {
    let threads = 96u32;
    let mut out = vec![f32::NAN; 2 * threads as usize * 3];
    let o = out.as_mut_ptr() as usize;
    // SAFETY: each thread writes its own slots; shared arrays hold `threads` floats.
    unsafe {
        launch(cfg(Dim3::x(3), Dim3::x(threads), threads * 4), || {
            let s = shared_array!(EMU_TEST_SHARED: [f32; 96]);
            let d = dynamic_shared_mem() as *mut f32;
            let (t, n, b) = (
                thread_idx_x() as usize,
                block_dim_x() as usize,
                block_idx_x() as usize,
            );
            *s.add(t) = (b * 1000 + t) as f32;
            *d.add(t) = -((b * 1000 + t) as f32);
            sync_threads();
            let o = o as *mut f32;
            *o.add(2 * (b * n + t)) = *s.add((t + 1) % n);
            *o.add(2 * (b * n + t) + 1) = *d.add((t + n - 1) % n);
        })
    };
    for b in 0..3 {
        for t in 0..threads as usize {
            let n = threads as usize;
            assert_eq!(out[2 * (b * n + t)], (b * 1000 + (t + 1) % n) as f32);
            assert_eq!(
                out[2 * (b * n + t) + 1],
                -((b * 1000 + (t + n - 1) % n) as f32)
            );
        }
    }
}

#[test]
fn shared_memory_is_poisoned_at_every_block_start() {
    let mut seen = [0f32; 4];
    let o = seen.as_mut_ptr() as usize;
    // SAFETY: thread 0 of each block writes its own slot.
    unsafe {
        launch(cfg(Dim3::x(4), Dim3::x(32), 16), || {
            let s = shared_array!(EMU_TEST_POISON: [f32; 1]);
            let d = dynamic_shared_mem() as *mut f32;
            if thread_idx_x() == 0 {
                *(o as *mut f32).add(block_idx_x() as usize) = *s + *d;
            }
            sync_threads();
            *s = 1.0;
            *d = 2.0;
        })
    };
    assert!(
        seen.iter().all(|v| v.is_nan()),
        "shared memory leaked between blocks: {seen:?}"
    );
}

#[test]
fn warp_shuffles_match_cuda_semantics() {
    let threads = 64usize;
    let mut out = vec![f32::NAN; threads * 10];
    let o = out.as_mut_ptr() as usize;
    // SAFETY: each thread writes its own 10 slots.
    unsafe {
        launch(cfg(Dim3::x(1), Dim3::x(threads as u32), 0), || {
            let t = thread_idx_x() as usize;
            let v = t as f32;
            let o = (o as *mut f32).add(t * 10);
            for (i, m) in [1u32, 2, 4, 8, 16].into_iter().enumerate() {
                *o.add(i) = shfl_xor_f32(v, m);
            }
            for (i, m) in [1u32, 2, 4, 8, 16].into_iter().enumerate() {
                *o.add(5 + i) = shfl_down_f32(v, m);
            }
        })
    };
    for t in 0..threads {
        let lane = t % 32;
        let base = t - lane;
        for (i, m) in [1usize, 2, 4, 8, 16].into_iter().enumerate() {
            assert_eq!(
                out[t * 10 + i],
                (base + (lane ^ m)) as f32,
                "xor {m} lane {t}"
            );
            let want = if lane + m < 32 { base + lane + m } else { t };
            assert_eq!(out[t * 10 + 5 + i], want as f32, "down {m} lane {t}");
        }
    }
}

#[test]
fn atomic_add_counts_every_thread() {
    let mut acc = [0f32; 2];
    let p = acc.as_mut_ptr() as usize;
    // SAFETY: all accesses are atomic adds.
    unsafe {
        launch(cfg(Dim3::xy(3, 2), Dim3::x(64), 0), || {
            atomic_add_f32(p as *mut f32, 1.0);
            atomic_add_f32((p as *mut f32).add(1), 0.5);
        })
    };
    assert_eq!(acc, [384.0, 192.0]);
}

#[test]
#[should_panic]
fn a_panicking_thread_fails_the_launch_instead_of_hanging() {
    // SAFETY: no memory is accessed.
    unsafe {
        launch(cfg(Dim3::x(1), Dim3::x(64), 0), || {
            if thread_idx_x() == 5 {
                panic!("thread 5 fails");
            }
            sync_threads();
        })
    };
}

/// The documented m16n8k16 fragment layout, written out here independently of the
/// emulator: (row, col) of the two halves of A register `r` held by `lane`.
fn a_coords(lane: usize, r: usize) -> [(usize, usize); 2] {
    let (g, t) = (lane / 4, lane % 4);
    let row = g + 8 * (r % 2);
    let col = 2 * t + 8 * (r / 2);
    [(row, col), (row, col + 1)]
}

/// (k, n) of the two halves of B register `r` held by `lane`.
fn b_coords(lane: usize, r: usize) -> [(usize, usize); 2] {
    let (g, t) = (lane / 4, lane % 4);
    [(2 * t + 8 * r, g), (2 * t + 8 * r + 1, g)]
}

/// (row, col) of C/D element `i` held by `lane`.
fn c_coords(lane: usize, i: usize) -> (usize, usize) {
    let (g, t) = (lane / 4, lane % 4);
    (g + 8 * (i / 2), 2 * t + i % 2)
}

fn mma_case<T: gpu_kernels::Storage>(bits: fn(T) -> u16) {
    let seed = 0x6d6d61u64 ^ T::NAME.len() as u64;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let mut gen = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| rand::Rng::gen_range(&mut rng, -2.0f32..2.0))
            .collect()
    };
    let a: Vec<T> = gen(16 * 16).into_iter().map(T::from_f32).collect();
    let b: Vec<T> = gen(16 * 8).into_iter().map(T::from_f32).collect();
    let c = gen(16 * 8);
    let pack = |x: [(usize, usize); 2], m: &[T], stride: usize| {
        bits(m[x[0].0 * stride + x[0].1]) as u32 | (bits(m[x[1].0 * stride + x[1].1]) as u32) << 16
    };
    let mut frags = Vec::new();
    for lane in 0..32 {
        let fa: [u32; 4] = std::array::from_fn(|r| pack(a_coords(lane, r), &a, 16));
        let fb: [u32; 2] = std::array::from_fn(|r| pack(b_coords(lane, r), &b, 8));
        let fc: [f32; 4] = std::array::from_fn(|i| {
            let (r, col) = c_coords(lane, i);
            c[r * 8 + col]
        });
        frags.push((fa, fb, fc));
    }
    let mut out = vec![f32::NAN; 32 * 4];
    let (o, f) = (out.as_mut_ptr() as usize, frags.as_ptr() as usize);
    // SAFETY: each lane reads its own fragments and writes its own four outputs.
    unsafe {
        launch(cfg(Dim3::x(1), Dim3::x(32), 0), || {
            let lane = thread_idx_x() as usize;
            let (fa, fb, fc) = *(f as *const ([u32; 4], [u32; 2], [f32; 4])).add(lane);
            let d = mma_m16n8k16::<T>(fa, fb, fc);
            for (i, v) in d.into_iter().enumerate() {
                *(o as *mut f32).add(lane * 4 + i) = v;
            }
        })
    };
    for lane in 0..32 {
        for i in 0..4 {
            let (r, col) = c_coords(lane, i);
            let want = c[r * 8 + col] as f64
                + (0..16)
                    .map(|k| a[r * 16 + k].to_f32() as f64 * b[k * 8 + col].to_f32() as f64)
                    .sum::<f64>();
            let got = out[lane * 4 + i] as f64;
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{} mma: lane {lane} element {i} (row {r}, col {col}): got {got}, want {want}",
                T::NAME
            );
        }
    }
}

#[test]
fn mma_m16n8k16_matches_f64_matmul_through_documented_layout() {
    mma_case::<half::bf16>(half::bf16::to_bits);
    mma_case::<half::f16>(half::f16::to_bits);
}

#[test]
fn ldmatrix_x4_gives_fragments_and_transposes() {
    // Four 8x8 matrices of u16, element (m, r, c) = m * 64 + r * 8 + c, rows 16-byte
    // aligned and padded (stride 12 halves = 24 bytes would break alignment; use 16).
    const STRIDE: usize = 16;
    let mut out = vec![0u32; 32 * 8];
    let o = out.as_mut_ptr() as usize;
    // SAFETY: lanes write their own slots; the shared buffer is sized for 4 x 8 rows.
    unsafe {
        launch(
            cfg(Dim3::x(1), Dim3::x(32), (4 * 8 * STRIDE * 2) as u32),
            || {
                let lane = thread_idx_x() as usize;
                let s = dynamic_shared_mem() as *mut u16;
                for i in 0..8 {
                    let (m, r) = (lane / 8, lane % 8);
                    *s.add((m * 8 + r) * STRIDE + i) = (m * 64 + r * 8 + i) as u16;
                }
                sync_threads();
                let row = SmemAddr::of(s.add(lane * STRIDE));
                let n = ldmatrix_x4_b16(row);
                let t = ldmatrix_x4_trans_b16(row);
                for i in 0..4 {
                    *(o as *mut u32).add(lane * 8 + i) = n[i];
                    *(o as *mut u32).add(lane * 8 + 4 + i) = t[i];
                }
            },
        )
    };
    for lane in 0..32u32 {
        let (g, t) = (lane / 4, lane % 4);
        for m in 0..4u32 {
            let at = |r: u32, c: u32| m * 64 + r * 8 + c;
            let n = at(g, 2 * t) | at(g, 2 * t + 1) << 16;
            let tr = at(2 * t, g) | at(2 * t + 1, g) << 16;
            assert_eq!(
                out[(lane * 8 + m) as usize],
                n,
                "ldmatrix lane {lane} matrix {m}"
            );
            assert_eq!(
                out[(lane * 8 + 4 + m) as usize],
                tr,
                "ldmatrix.trans lane {lane} matrix {m}"
            );
        }
    }
}
