//! This process's memory as Linux reports it, for the startup log, the
//! benchmarks and the loading examples that state what loading costs.

/// A `kB` field of `/proc/self/status` (`"VmRSS"`: resident now, `"VmHWM"`:
/// the peak) in KiB; `None` where `/proc` does not say (not Linux).
pub fn status_kib(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn resident_memory_reads_where_proc_exists() {
        if std::path::Path::new("/proc/self/status").exists() {
            let rss = super::status_kib("VmRSS").expect("VmRSS");
            let peak = super::status_kib("VmHWM").expect("VmHWM");
            assert!(rss > 0 && peak >= rss, "{rss} {peak}");
        }
        assert_eq!(super::status_kib("NoSuchField"), None);
    }
}
