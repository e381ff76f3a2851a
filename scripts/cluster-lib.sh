# Shell helpers the benchmark scripts share (sourced, not run).

# The RESP port of the first node whose role is $1 (leader or follower), from the output of
# `chorus cluster status` on standard input.
node_port() {
    awk -v role="$1" '$3 == role { split($7, a, ":"); print a[2]; exit }'
}

# The pids of the nodes of the cluster in directory $1, one per line (pid files end without a
# newline).
node_pids() {
    local file
    for file in "$1"/node*/pid; do
        cat "$file"
        echo
    done
}

# Clock ticks of CPU the given processes have used so far, as "USER SYSTEM".
cpu_ticks() {
    local pid
    for pid in "$@"; do awk '{ print $14, $15 }' "/proc/$pid/stat"; done | awk '{ u += $1; s += $2 } END { print u + 0, s + 0 }'
}
