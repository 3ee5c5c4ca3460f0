"""Static checks of the systemd units, sysusers.d and tmpfiles.d files (no systemd is booted)."""
