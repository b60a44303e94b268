# enroot start --conf: the container's environment (enroot passes none of the host's by itself): each
# variable named in CLUSTERKIT_CONTAINER_ENV (clusterkit's launch plan names them, spec.enroot) that
# is set here, with its value as it is; an unset one stays unset (enroot's --env NAME would set it
# empty). Nothing here is evaluated: a name that is not one is skipped, and a value holding a line
# break is left out with a line on stderr (enroot's environment file has one variable per line, and
# the rest of the value would become variables of its own).
environ() {
    local name
    for name in ${CLUSTERKIT_CONTAINER_ENV-}; do
        [[ ${name} =~ ^[A-Za-z_][A-Za-z0-9_]*$ && -n ${!name+set} ]] || continue
        if [[ ${!name} == *$'\n'* ]]; then
            printf 'clusterkit: %s holds a line break, which enroot cannot pass: not passed\n' "${name}" >&2
        else
            printf '%s=%s\n' "${name}" "${!name}"
        fi
    done
}
