# Packaging entry points (docs/packaging.md). Everything else: ./dev.sh.
#
#   make deb              Debian packages dist/steadqd_<version>_<arch>.deb and
#                         dist/cockpit-steadq_<version>_all.deb (the Cockpit page), checked by lintian
#                         (DEB_VERSION=0.1.0+1 builds a higher version, e.g. to test upgrades)
#   make bundle           appliance bundle dist/steadqd-bundle-<version>-<arch>.tar.gz
#   make packages         both
#   make clean-packaging  remove build/deb, build/bundle and the packaging outputs in dist/
#
# Both build in a staged copy under build/; the checkout is never modified. Run as root on
# Debian 12: missing build dependencies are installed with apt-get.

DEB_VERSION ?=

.PHONY: deb bundle packages clean-packaging

deb:
	packaging/build-deb.sh --out dist --work build/deb $(if $(DEB_VERSION),--version $(DEB_VERSION))

bundle:
	packaging/build-bundle.sh --out dist --work build/bundle

packages: deb bundle

clean-packaging:
	rm -rf build/deb build/bundle
	rm -f dist/steadqd_* dist/cockpit-steadq_* dist/steadqd-bundle-* dist/lintian.txt
	-rmdir dist build 2>/dev/null
