# Shared helpers of the GPU check scripts (sourced, not run).

# Executables of cargo's `--message-format=json` compiler-artifact messages on stdin,
# one per line.
json_executables() {
  python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])
'
}
