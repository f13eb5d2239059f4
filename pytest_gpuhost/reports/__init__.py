"""Reporters: every report (terminal, JSON, JUnit properties, Prometheus, Allure) is fed from
the ordered result records and the run's information; none reads a host or fixes anything."""
