//! Names the kernel families the build machine's CPU runs, so the kernel
//! tests can say which ISAs they covered: a test for a family this CPU
//! lacks shows as ignored with the reason, instead of passing without
//! having run (`cfg(host_avx2)`, `cfg(host_avx512_vnni)`; set only when
//! building for the machine itself, not when cross-compiling).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(host_avx2)");
    println!("cargo::rustc-check-cfg=cfg(host_avx512_vnni)");
    println!("cargo::rerun-if-changed=build.rs");
    let (target, host) = (std::env::var("TARGET"), std::env::var("HOST"));
    if target.is_err() || target != host {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma");
        if avx2 {
            println!("cargo::rustc-cfg=host_avx2");
        }
        if avx2
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
        {
            println!("cargo::rustc-cfg=host_avx512_vnni");
        }
    }
}
