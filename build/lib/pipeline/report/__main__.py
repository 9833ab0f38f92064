from pipeline.report import main

main()
