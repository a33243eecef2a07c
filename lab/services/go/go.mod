module ralab/svc

go 1.19
