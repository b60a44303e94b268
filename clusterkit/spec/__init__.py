"""What a job is: the recipe as written, cluster profiles, the resolved recipe. No I/O; imports nothing of clusterkit but errors."""
