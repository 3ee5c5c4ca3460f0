"""Running a job's command: its process, its guard, the exec helper, and the hold on leasing."""
