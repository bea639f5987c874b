from hypothesis import HealthCheck, settings

# numpy on a shared 2-core machine: timing-based deadlines would only make the suite flaky
settings.register_profile("kvlesson", deadline=None, max_examples=150,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kvlesson")
