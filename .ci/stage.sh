# stage LIMIT_S COMMAND...: run one CI stage under a wall-clock limit, saying when it starts, how long it took, and
# which stage ran out if it did (timeout signals the stage's whole process group; 20 s later it kills what is left).
stage() {
    local limit=$1
    shift
    local start=$SECONDS status=0
    echo "==> CI stage '$*' (limit ${limit} s)"
    timeout --kill-after=20 "$limit" "$@" || status=$?
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        echo "==> CI stage '$*' ran out of its ${limit} s limit after $((SECONDS - start)) s: stopped" >&2
        exit "$status"
    elif [ "$status" -ne 0 ]; then
        echo "==> CI stage '$*' failed (exit status $status) after $((SECONDS - start)) s" >&2
        exit "$status"
    fi
    echo "==> CI stage '$*' passed in $((SECONDS - start)) s"
}
