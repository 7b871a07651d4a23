//! `entries::emulate`: launching an entry point by name with host-style
//! arguments runs the same kernel as calling it directly, and a wrong name or
//! argument list is an error before anything runs.

use gpu_kernels::entries::{emulate, EmulateError};
use gpu_kernels::{launch as geom, KernelArg};

fn addr<T>(p: *const T) -> KernelArg {
    KernelArg::Ptr(p as usize as u64)
}

#[test]
fn rms_norm_by_name_matches_the_formula() {
    let (rows, hidden) = (3usize, 50usize);
    let x: Vec<f32> = (0..rows * hidden)
        .map(|i| (i as f32 * 0.37).sin())
        .collect();
    let w: Vec<f32> = (0..hidden)
        .map(|i| 0.5 + i as f32 / hidden as f32)
        .collect();
    let mut out = vec![f32::NAN; rows * hidden];
    let args = [
        addr(out.as_mut_ptr()),
        addr(x.as_ptr()),
        addr(w.as_ptr()),
        KernelArg::F32(1e-5),
        KernelArg::U32(hidden as u32),
    ];
    // SAFETY: buffers sized [rows, hidden] / [hidden], grid of `rows` blocks.
    unsafe { emulate("rms_norm_f32", geom::per_row(rows as u32, 32), &args) }.expect("launch");
    for r in 0..rows {
        let row = &x[r * hidden..(r + 1) * hidden];
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / hidden as f32 + 1e-5).sqrt();
        for j in 0..hidden {
            let want = row[j] * inv * w[j];
            let got = out[r * hidden + j];
            assert!(
                (got - want).abs() < 1e-5,
                "row {r} col {j}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn wrong_names_and_arguments_are_refused_before_running() {
    let mut out = vec![0.0f32; 4];
    let cfg = geom::per_row(1, 32);
    // SAFETY: every call below is refused before any kernel code runs.
    unsafe {
        assert_eq!(
            emulate("no_such_kernel", cfg, &[]),
            Err(EmulateError::UnknownKernel)
        );
        let short = [addr(out.as_mut_ptr()), KernelArg::U32(4)];
        match emulate("rms_norm_f32", cfg, &short) {
            Err(EmulateError::Args(m)) => assert_eq!(m.kernel, "rms_norm_f32"),
            other => panic!("expected an argument error, got {other:?}"),
        }
        let p = addr(out.as_mut_ptr());
        let swapped = [p, p, p, KernelArg::U32(4), KernelArg::F32(1e-5)];
        match emulate("rms_norm_f32", cfg, &swapped) {
            Err(EmulateError::Args(m)) => assert_eq!(m.index, 3, "{m}"),
            other => panic!("expected an argument error, got {other:?}"),
        }
    }
    assert!(
        out.iter().all(|&v| v == 0.0),
        "a refused launch wrote memory"
    );
}
