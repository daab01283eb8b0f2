# Sourced by scripts/test: the host tools the test suite drives for real. Installed with apt when
# missing (as root, as on CI); otherwise the command to run is printed and the tests that need a
# tool fail with their own message.
#   mmdebstrap       builds the sandbox's Debian base images (no registry can be pulled from)
#   docker-registry  the registry `sparkstack ship` starts on the build host
#   busybox-static   the tiny base image of the image-chain build tests
#   sudo             visudo checks the sudoers rule the kit installs
#   prometheus       promtool checks and unit-tests the rules `metrics write-config` writes; a real
#                    Prometheus scrapes `metrics serve` while the sandbox serves
#   prometheus-alertmanager  delivers a fired alert to a webhook in a test (amtool checks its config)
#   tmux             `sparkstack top` runs under a real terminal in a test
needed=()
command -v mmdebstrap >/dev/null || needed+=(mmdebstrap)
command -v docker-registry >/dev/null || needed+=(docker-registry)
[ -x /bin/busybox ] || needed+=(busybox-static)
command -v visudo >/dev/null || needed+=(sudo)
command -v promtool >/dev/null || needed+=(prometheus)
command -v prometheus-alertmanager >/dev/null || needed+=(prometheus-alertmanager)
command -v tmux >/dev/null || needed+=(tmux)
if [ ${#needed[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "provision: apt-get install ${needed[*]}" >&2
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${needed[@]}" >/dev/null
    else
        echo "provision: missing ${needed[*]}; run: sudo apt-get install ${needed[*]}" >&2
    fi
fi
