"""The Grafana dashboard generator; the JSON it writes ships in the chart (helm/ddpjob/dashboards/)."""
